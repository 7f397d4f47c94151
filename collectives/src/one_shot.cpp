// One-shot reduction, for reduce_scatter and all_reduce: every rank reads
// its part of every peer's input and reduces it in one kernel.

#include "collective_helpers.hpp"
#include "copy_streams.hpp"
#include "kernels.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/cuda_try.hpp>

namespace symmpool {

void Communicator::one_shot(const void* in, std::size_t in_count, void* out, std::size_t count,
                            std::size_t src_offset, DataType type, float scale, cudaStream_t stream) {
  const std::size_t es = element_size(type);
  require_symmetric(in, in_count * es, "reduction input");
  detail::PeerPointers peers{};
  for (int p = 0; p < world(); ++p) peers.ptr[p] = heap_.peer_ptr(in, p);
  // Peers read our input until the end: results that would land on it go to
  // scratch first.
  const bool aliased = detail::overlap(in, in_count * es, out, count * es);
  detail::OutPointers dst{};
  dst.ptr[0] = aliased ? scratch(count * es, stream) : out;
  const bool fused = fused_kernel(count * es);
  if (!fused) enqueue_barrier(stream, BarrierKind::kKernel);
  SYMMPOOL_CUDA_TRY(detail::launch_reduce(block_sync(fused), peers, src_offset, dst, 1, 0, count,
                                          count, world(), type, scale, max_blocks_, stream));
  if (!fused) enqueue_barrier(stream, BarrierKind::kKernel);
  if (aliased) detail::copy_on(stream, out, dst.ptr[0], count * es);
}

}  // namespace symmpool
