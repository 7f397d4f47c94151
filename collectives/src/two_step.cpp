// reduce_scatter, and its two-step algorithm: copy engines bring every
// peer's chunk of this rank here, then a kernel reduces from local memory.
// One-shot (one_shot.cpp) is the other choice.

#include "collective_helpers.hpp"
#include "copy_streams.hpp"
#include "kernels.hpp"
#include "reduction.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/error.hpp>

#include <vector>

namespace symmpool {

void Communicator::reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                                  cudaStream_t stream, Algorithm algorithm) {
  check_errors();
  begin_call("reduce_scatter");
  if (count == 0) return;
  const Reduction r{in, out, count, type, scale(op), stream};
  in_order(stream, "reduce_scatter", r.bytes() * static_cast<std::size_t>(world()),
           [&] { enqueue_reduce_scatter(r, algorithm); });
}

void Communicator::enqueue_reduce_scatter(const Reduction& r, Algorithm algorithm) {
  const std::size_t n = static_cast<std::size_t>(world());
  if (algorithm == Algorithm::kAuto)
    algorithm = choose_algorithm(CollectiveKind::kReduceScatter, r.bytes() * n, world());
  detail::expect_algorithm(algorithm == Algorithm::kOneShot || algorithm == Algorithm::kTwoStep, algorithm,
                           "reduce_scatter");
  if (algorithm == Algorithm::kTwoStep)
    two_step(r);
  else
    one_shot(r, r.count * n, r.count * static_cast<std::size_t>(rank()));  // our chunk of every input
}

void Communicator::two_step(const Reduction& r) {
  const void* in = r.in;
  const std::size_t bytes = r.bytes();
  const int n = world(), me = rank();
  require_symmetric(in, bytes * static_cast<std::size_t>(n), "reduce_scatter input");
  // Copy engines bring every rank's chunk `me` here; then peers are free and
  // an SM kernel reduces from local memory only.
  char* staged = static_cast<char*>(scratch(bytes * static_cast<std::size_t>(n), r.stream));
  std::vector<detail::Copy> copies;
  for (int k = 1; k < n; ++k) {
    const int p = (me + k) % n;
    copies.push_back({staged + static_cast<std::size_t>(p) * bytes,
                      detail::at(heap_.peer_ptr(in, p), bytes * static_cast<std::size_t>(me)), bytes});
  }
  enqueue_barrier(r.stream, BarrierKind::kKernel);
  copies_->issue(copies, r.stream);
  enqueue_barrier(r.stream, BarrierKind::kKernel);
  detail::ReduceLaunch launch = reduce_launch(r, /*fused=*/false);
  const void** chunks = launch.in.ptr;
  for (int p = 0; p < n; ++p) chunks[p] = staged + static_cast<std::size_t>(p) * bytes;
  chunks[me] =
      detail::at(in, bytes * static_cast<std::size_t>(me));  // read in place: same index, same thread
  if (detail::overlap(in, bytes * static_cast<std::size_t>(n), r.out, bytes) && r.out != chunks[me]) {
    detail::copy_on(r.stream, staged + static_cast<std::size_t>(me) * bytes, chunks[me], bytes);
    chunks[me] = staged + static_cast<std::size_t>(me) * bytes;
  }
  SYMMPOOL_CUDA_TRY(detail::launch_reduce(launch, r.stream));
  detail::count_algorithm(Algorithm::kTwoStep);
}

}  // namespace symmpool
