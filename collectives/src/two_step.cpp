// reduce_scatter, and its two-step algorithm: copy engines bring every
// peer's chunk of this rank here, then a kernel reduces from local memory.
// One-shot (one_shot.cpp) is the other choice.

#include "collective_helpers.hpp"
#include "copy_streams.hpp"
#include "kernels.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/cuda_try.hpp>

#include <vector>

namespace symmpool {

void Communicator::reduce_scatter(const void* in, void* out, std::size_t count, DataType type,
                                  ReduceOp op, cudaStream_t stream, Algorithm algorithm) {
  check_errors();
  begin_call("reduce_scatter");
  if (count == 0) return;
  in_order(stream, "reduce_scatter", count * static_cast<std::size_t>(world()) * element_size(type),
           [&] { enqueue_reduce_scatter(in, out, count, type, op, stream, algorithm); });
}

void Communicator::enqueue_reduce_scatter(const void* in, void* out, std::size_t count, DataType type,
                                          ReduceOp op, cudaStream_t stream, Algorithm algorithm) {
  const std::size_t n = static_cast<std::size_t>(world());
  if (algorithm == Algorithm::kAuto)
    algorithm = choose_algorithm(CollectiveKind::kReduceScatter, count * n * element_size(type), world());
  detail::expect_algorithm(algorithm == Algorithm::kOneShot || algorithm == Algorithm::kTwoStep, algorithm,
                           "reduce_scatter");
  if (algorithm == Algorithm::kTwoStep)
    two_step(in, out, count, type, scale(op), stream);
  else
    one_shot(in, count * n, out, count, count * static_cast<std::size_t>(rank()), type, scale(op), stream);
}

void Communicator::two_step(const void* in, void* out, std::size_t count, DataType type,
                            float scale, cudaStream_t stream) {
  const std::size_t es = element_size(type), bytes = count * es;
  const int n = world(), me = rank();
  require_symmetric(in, bytes * static_cast<std::size_t>(n), "reduce_scatter input");
  // Copy engines bring every rank's chunk `me` here; then peers are free and
  // an SM kernel reduces from local memory only.
  char* staged = static_cast<char*>(scratch(bytes * static_cast<std::size_t>(n), stream));
  std::vector<detail::Copy> copies;
  for (int k = 1; k < n; ++k) {
    const int p = (me + k) % n;
    copies.push_back({staged + static_cast<std::size_t>(p) * bytes,
                      detail::at(heap_.peer_ptr(in, p), bytes * static_cast<std::size_t>(me)), bytes});
  }
  enqueue_barrier(stream, BarrierKind::kKernel);
  copies_->issue(copies, stream);
  enqueue_barrier(stream, BarrierKind::kKernel);
  detail::PeerPointers chunks{};
  for (int p = 0; p < n; ++p) chunks.ptr[p] = staged + static_cast<std::size_t>(p) * bytes;
  chunks.ptr[me] = detail::at(in, bytes * static_cast<std::size_t>(me));  // read in place: same index, same thread
  detail::OutPointers dst{};
  dst.ptr[0] = out;
  if (detail::overlap(in, bytes * static_cast<std::size_t>(n), out, bytes) && out != chunks.ptr[me]) {
    detail::copy_on(stream, staged + static_cast<std::size_t>(me) * bytes, chunks.ptr[me], bytes);
    chunks.ptr[me] = staged + static_cast<std::size_t>(me) * bytes;
  }
  SYMMPOOL_CUDA_TRY(detail::launch_reduce(block_sync(false), chunks, 0, dst, 1, 0, count, count, n,
                                          type, scale, max_blocks_, stream));
}

}  // namespace symmpool
