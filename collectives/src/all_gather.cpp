// all_gather: copy engines pull from or push to every peer between two
// barriers, or one kernel (small messages) reads every peer and meets them
// inside.

#include "algorithms.hpp"
#include "collective_helpers.hpp"
#include "copy_streams.hpp"
#include "kernels.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/error.hpp>

#include <vector>

namespace symmpool::detail {

void all_gather(AlgorithmContext& ctx, const void* in, void* out, std::size_t bytes_per_rank,
                cudaStream_t stream, Algorithm algorithm, BarrierKind kind, const void* stage_from) {
  const int n = ctx.world(), me = ctx.rank();
  const std::size_t total = bytes_per_rank * static_cast<std::size_t>(n);
  if (algorithm == Algorithm::kAuto) algorithm = choose_algorithm(CollectiveKind::kAllGather, total, n);
  expect_algorithm(algorithm == Algorithm::kCopyEnginePull || algorithm == Algorithm::kCopyEnginePush ||
                       algorithm == Algorithm::kKernel,
                   algorithm, "all_gather");
  auto slice = [&](int p) { return static_cast<std::size_t>(p) * bytes_per_rank; };
  // In place (FSDP2's way), each rank's input is its own slice of the output,
  // so peer p's input is its output's slice p; otherwise the inputs must be
  // symmetric themselves.
  const bool in_place = in == at(out, slice(me));
  if (in_place || algorithm == Algorithm::kCopyEnginePush)
    ctx.require_symmetric(out, total, "all_gather output");
  if (!in_place && algorithm != Algorithm::kCopyEnginePush)
    ctx.require_symmetric(in, bytes_per_rank, "all_gather input");
  auto peer_input = [&](int p) {
    return in_place ? at(ctx.peer_ptr(out, p), slice(p)) : static_cast<const char*>(ctx.peer_ptr(in, p));
  };

  if (algorithm == Algorithm::kKernel) {
    PeerPointers src{};
    for (int p = 0; p < n; ++p) src.ptr[p] = p == me ? in : peer_input(p);
    const Staging staging{static_cast<const char*>(stage_from), static_cast<char*>(const_cast<void*>(in))};
    SYMMPOOL_CUDA_TRY(launch_gather_copy(ctx.block_sync(true), src, static_cast<char*>(out), bytes_per_rank,
                                         n, stream, staging));
    count_algorithm(algorithm);
    return;
  }
  if (stage_from != nullptr)  // before the first meeting: the peers read `in` after it
    SYMMPOOL_CUDA_TRY(
        cudaMemcpyAsync(const_cast<void*>(in), stage_from, bytes_per_rank, cudaMemcpyDeviceToDevice, stream));
  std::vector<Copy> copies;
  for (int k = 1; k < n; ++k) {
    const int p = (me + k) % n;  // spread the copies over the links
    if (algorithm == Algorithm::kCopyEnginePull)
      copies.push_back({at(out, slice(p)), peer_input(p), bytes_per_rank});
    else
      copies.push_back({at(ctx.peer_ptr(out, p), slice(me)), in, bytes_per_rank});
  }
  // Out of place, our own slice is a copy within this GPU that no peer
  // reads or writes: it needs no barrier, and on a stream of its own it runs
  // beside the copies over NVLink (after them, it added its whole time).
  // It starts after the first meeting: a copy within one GPU runs on SMs,
  // and begun before it, it held the barrier kernel back until it was done
  // (an out-of-place call then took the in-place time plus the whole copy).
  CopyStreams& lanes = ctx.copy_streams();
  ctx.enqueue_barrier(stream, kind);  // inputs ready and outputs free everywhere
  if (!in_place) lanes.start_local({at(out, slice(me)), in, bytes_per_rank}, stream);
  lanes.issue(copies, stream);
  if (!in_place) lanes.join_local(stream);
  ctx.enqueue_barrier(stream, kind);  // every copy landed; nobody reuses a buffer a peer still reads
  count_algorithm(algorithm);
}

}  // namespace symmpool::detail
