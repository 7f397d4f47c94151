// all_gather: copy engines pull from or push to every peer between two
// barriers, or one kernel (small messages) reads every peer and meets them
// inside.

#include "capture_state.hpp"
#include "collective_helpers.hpp"
#include "copy_streams.hpp"
#include "kernels.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/error.hpp>

#include <vector>

namespace symmpool {

void Communicator::all_gather(const void* in, void* out, std::size_t bytes_per_rank, cudaStream_t stream,
                              Algorithm algorithm, BarrierKind kind) {
  all_gather_in_order(in, out, bytes_per_rank, stream, algorithm, kind, nullptr);
}

void Communicator::all_gather_staged(const void* local, void* stage, void* out, std::size_t bytes_per_rank,
                                     cudaStream_t stream, Algorithm algorithm, BarrierKind kind) {
  all_gather_in_order(stage, out, bytes_per_rank, stream, algorithm, kind, local);
}

void Communicator::all_gather_in_order(const void* in, void* out, std::size_t bytes_per_rank,
                                       cudaStream_t stream, Algorithm algorithm, BarrierKind kind,
                                       const void* stage_from) {
  check_errors();
  begin_call("all_gather");
  if (bytes_per_rank == 0) return;
  in_order(stream, "all_gather", bytes_per_rank * static_cast<std::size_t>(world()),
           [&] { enqueue_all_gather(in, out, bytes_per_rank, stream, algorithm, kind, stage_from); });
}

void Communicator::enqueue_all_gather(const void* in, void* out, std::size_t bytes_per_rank,
                                      cudaStream_t stream, Algorithm algorithm, BarrierKind kind,
                                      const void* stage_from) {
  const int n = world(), me = rank();
  const std::size_t total = bytes_per_rank * static_cast<std::size_t>(n);
  if (algorithm == Algorithm::kAuto) algorithm = choose_algorithm(CollectiveKind::kAllGather, total, n);
  detail::expect_algorithm(algorithm == Algorithm::kCopyEnginePull ||
                               algorithm == Algorithm::kCopyEnginePush || algorithm == Algorithm::kKernel,
                           algorithm, "all_gather");
  auto slice = [&](int p) { return static_cast<std::size_t>(p) * bytes_per_rank; };
  // In place (FSDP2's way), each rank's input is its own slice of the output,
  // so peer p's input is its output's slice p; otherwise the inputs must be
  // symmetric themselves.
  const bool in_place = in == detail::at(out, slice(me));
  if (in_place || algorithm == Algorithm::kCopyEnginePush) require_symmetric(out, total, "all_gather output");
  if (!in_place && algorithm != Algorithm::kCopyEnginePush)
    require_symmetric(in, bytes_per_rank, "all_gather input");
  auto peer_input = [&](int p) {
    return in_place ? detail::at(heap_.peer_ptr(out, p), slice(p))
                    : static_cast<const char*>(heap_.peer_ptr(in, p));
  };

  if (algorithm == Algorithm::kKernel) {
    detail::PeerPointers src{};
    for (int p = 0; p < n; ++p) src.ptr[p] = p == me ? in : peer_input(p);
    const detail::Staging staging{static_cast<const char*>(stage_from),
                                  static_cast<char*>(const_cast<void*>(in))};
    SYMMPOOL_CUDA_TRY(detail::launch_gather_copy(block_sync(true), src, static_cast<char*>(out),
                                                 bytes_per_rank, n, stream, staging));
    detail::count_algorithm(algorithm);
    return;
  }
  if (stage_from != nullptr)  // before the first meeting: the peers read `in` after it
    SYMMPOOL_CUDA_TRY(
        cudaMemcpyAsync(const_cast<void*>(in), stage_from, bytes_per_rank, cudaMemcpyDeviceToDevice, stream));
  std::vector<detail::Copy> copies;
  for (int k = 1; k < n; ++k) {
    const int p = (me + k) % n;  // spread the copies over the links
    if (algorithm == Algorithm::kCopyEnginePull)
      copies.push_back({detail::at(out, slice(p)), peer_input(p), bytes_per_rank});
    else
      copies.push_back({detail::at(heap_.peer_ptr(out, p), slice(me)), in, bytes_per_rank});
  }
  // Out of place, our own slice is a copy within this GPU that no peer
  // reads or writes: it needs no barrier, and on a stream of its own it runs
  // beside the copies over NVLink (after them, it added its whole time).
  // It starts after the first meeting: a copy within one GPU runs on SMs,
  // and begun before it, it held the barrier kernel back until it was done
  // (an out-of-place call then took the in-place time plus the whole copy).
  detail::CopyStreams& lanes = copies_->for_call(capturing());
  enqueue_barrier(stream, kind);  // inputs ready and outputs free everywhere
  if (!in_place) lanes.start_local({detail::at(out, slice(me)), in, bytes_per_rank}, stream);
  lanes.issue(copies, stream);
  if (!in_place) lanes.join_local(stream);
  enqueue_barrier(stream, kind);  // every copy landed; nobody reuses a buffer a peer still reads
  detail::count_algorithm(algorithm);
}

}  // namespace symmpool
