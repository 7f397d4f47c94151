// The two-step algorithm, for reduce_scatter and all_reduce: copy engines
// pull this rank's chunk from every peer into staging, a local kernel
// reduces it, and (all_reduce) copy engines push the result into every
// peer's output. NVLink carries only copy-engine traffic and the kernel
// reads local memory only; pieces of the chunk go through the three steps
// as a pipeline (stream_pipeline.hpp).

#include "algorithms.hpp"
#include "collective_helpers.hpp"
#include "copy_streams.hpp"
#include "kernels.hpp"
#include "stream_pipeline.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/error.hpp>

#include <algorithm>

namespace symmpool::detail {

namespace {
// Staging slots of the pipeline: a pull may run two pieces ahead of the reduce.
constexpr int kStagingSlots = 3;

void* two_step(AlgorithmContext& ctx, const Reduction& r, const TwoStepChunk& chunk, bool stage_result);

}  // namespace

void two_step_reduce_scatter(AlgorithmContext& ctx, const Reduction& r) {
  const std::size_t bytes = r.bytes();
  const int n = ctx.world(), me = ctx.rank();
  const std::size_t ours = bytes * static_cast<std::size_t>(me);
  ctx.require_symmetric(r.in, bytes * static_cast<std::size_t>(n), "reduce_scatter input");
  TwoStepChunk chunk;
  for (int p = 0; p < n; ++p) chunk.sources.ptr[p] = at(ctx.peer_ptr(r.in, p), ours);
  chunk.sources.ptr[me] = at(r.in, ours);  // read in place: same index, same thread
  chunk.count = r.count;
  chunk.result = r.out;
  // Peers read every chunk of our input but ours until the end: a result
  // that would land there goes to staging first. (Local: the barriers and
  // the pipeline are the same on every rank either way.)
  const bool aliased =
      overlap(r.in, bytes * static_cast<std::size_t>(n), r.out, bytes) && r.out != chunk.sources.ptr[me];
  void* staged_result = two_step(ctx, r, chunk, /*stage_result=*/aliased);
  if (aliased) copy_on(r.stream, r.out, staged_result, bytes);
  count_algorithm(Algorithm::kTwoStep);
}

void two_step_all_reduce(AlgorithmContext& ctx, const Reduction& r) {
  const std::size_t es = element_size(r.type);
  const int n = ctx.world();
  const ChunkOfRank mine = chunk_of_rank(ctx, r.count, es);
  TwoStepChunk chunk;
  for (int p = 0; p < n; ++p) chunk.sources.ptr[p] = at(ctx.peer_ptr(r.in, p), mine.first * es);
  chunk.sources.ptr[ctx.rank()] = at(r.in, mine.first * es);
  chunk.result = at(r.out, mine.first * es);
  for (int p = 0; p < n; ++p) chunk.pushes.ptr[p] = at(ctx.peer_ptr(r.out, p), mine.first * es);
  chunk.count = mine.count;
  chunk.push = true;
  // Each rank pulls only its own chunk of the peers' inputs and writes only
  // its own chunk of their outputs, after pulling it: in place needs no
  // barrier between the steps.
  two_step(ctx, r, chunk, /*stage_result=*/false);
  count_algorithm(Algorithm::kTwoStep);
}

namespace {

// Enqueues the two-step pipeline of `chunk` between two barriers; with
// stage_result, the result lands in scratch, which it returns.
void* two_step(AlgorithmContext& ctx, const Reduction& r, const TwoStepChunk& chunk, bool stage_result) {
  const std::size_t es = element_size(r.type);
  const int n = ctx.world(), me = ctx.rank();
  // Pieces of whole 16-byte vectors (from the chunk's start), so copies and
  // loads stay on vectors wherever the chunk itself is aligned. At most half
  // the chunk: one piece is no pipeline (its reduce waits for the whole
  // pull: a 64 MiB all-reduce was clearly slower in one piece than in two),
  // and a small call stages little. The setting caps a piece.
  const std::size_t per_vector = 16 / es;
  auto whole_vectors = [&](std::size_t count) { return (count + per_vector - 1) / per_vector * per_vector; };
  const std::size_t piece = std::max(
      per_vector,
      std::min(whole_vectors((chunk.count + 1) / 2),
               static_cast<std::size_t>(ctx.tuning().two_step_piece_bytes) / es / per_vector * per_vector));
  const int pieces = piece ? static_cast<int>((chunk.count + piece - 1) / piece) : 0;
  const int slots = std::min(pieces, kStagingSlots);
  const std::size_t slot_bytes = piece * es * static_cast<std::size_t>(n - 1);
  // One scratch buffer, the slots and then the staged result, taken before
  // the opening barrier: growing it may wait for earlier work, never for
  // peers stuck in this call.
  const std::size_t staging_bytes = slot_bytes * static_cast<std::size_t>(slots);
  const std::size_t scratch_bytes = staging_bytes + (stage_result ? chunk.count * es : 0);
  char* scratch_base = scratch_bytes ? static_cast<char*>(ctx.scratch(scratch_bytes)) : nullptr;
  void* staged_result = stage_result ? scratch_base + staging_bytes : nullptr;
  void* result = staged_result ? staged_result : chunk.result;
  // Peer p's piece in a slot: peers in the order (me + 1), (me + 2), ...
  auto staged = [&](int slot, int p) {
    const int index = (p - me - 1 + n) % n;
    return scratch_base + static_cast<std::size_t>(slot) * slot_bytes +
           static_cast<std::size_t>(index) * piece * es;
  };
  auto first_of = [&](int k) { return static_cast<std::size_t>(k) * piece; };
  auto count_of = [&](int k) { return std::min(piece, chunk.count - first_of(k)); };

  auto pull = [&](int k, int slot, cudaStream_t s) {
    for (int i = 1; i < n; ++i) {
      const int p = (me + i) % n;  // spread the copies over the links
      copy_on(s, staged(slot, p), at(chunk.sources.ptr[p], first_of(k) * es), count_of(k) * es);
    }
  };
  auto reduce = [&](int k, int slot, cudaStream_t s) {
    ReduceLaunch launch = reduce_launch(ctx, r, /*fused=*/false, 0);
    for (int p = 0; p < n; ++p)
      launch.in.ptr[p] = p == me ? at(chunk.sources.ptr[me], first_of(k) * es) : staged(slot, p);
    launch.out.ptr[0] = at(result, first_of(k) * es);
    launch.count = launch.grid_count = count_of(k);
    SYMMPOOL_CUDA_TRY(launch_reduce(launch, s));
  };
  auto push = [&](int k, int, cudaStream_t s) {
    for (int i = 1; i < n; ++i) {
      const int p = (me + i) % n;
      copy_on(s, at(chunk.pushes.ptr[p], first_of(k) * es), at(result, first_of(k) * es), count_of(k) * es);
    }
  };
  ctx.enqueue_barrier(r.stream, BarrierKind::kKernel);  // inputs ready and outputs free everywhere
  ctx.pipeline().run(pieces, std::max(slots, 1), r.stream, pull, reduce,
                     chunk.push ? StreamPipeline::Stage(push) : StreamPipeline::Stage());
  ctx.enqueue_barrier(r.stream, BarrierKind::kKernel);  // every copy landed; nobody reads our input any more
  return staged_result;
}

}  // namespace

}  // namespace symmpool::detail
