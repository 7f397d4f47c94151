// The two-shot all-reduce: each rank reduces one chunk and writes it into
// every rank's output.

#include "algorithms.hpp"
#include "collective_helpers.hpp"
#include "kernels.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/error.hpp>

namespace symmpool::detail {

void two_shot(AlgorithmContext& ctx, const Reduction& r) {
  const std::size_t es = element_size(r.type);
  ctx.require_symmetric(r.in, r.bytes(), "all_reduce input");
  ctx.require_symmetric(r.out, r.bytes(), "all_reduce output (two-shot)");
  // Rank i reduces chunk i and writes it into every rank's output.
  const ChunkOfRank mine = chunk_of_rank(ctx, r.count, es);
  const bool fused = fused_reduction(ctx, mine.stride * es);
  ReduceLaunch launch = reduce_launch(ctx, r, fused, kTwoShotFusedBlocks);
  for (int p = 0; p < ctx.world(); ++p) {
    launch.in.ptr[p] = ctx.peer_ptr(r.in, p);
    launch.out.ptr[p] = ctx.peer_ptr(r.out, p);
  }
  launch.n_outs = ctx.world();
  launch.src_offset = mine.first;
  launch.dst_offset = mine.first;
  launch.count = mine.count;
  launch.grid_count = mine.stride;  // equal on every rank, even where the last chunk is short
  if (!fused) ctx.enqueue_barrier(r.stream, BarrierKind::kKernel);
  SYMMPOOL_CUDA_TRY(launch_reduce(launch, r.stream));
  if (!fused) ctx.enqueue_barrier(r.stream, BarrierKind::kKernel);
  count_algorithm(Algorithm::kTwoShot);
}

}  // namespace symmpool::detail
