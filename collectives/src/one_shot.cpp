// One-shot reduction, for reduce_scatter and all_reduce: every rank reads
// its part of every peer's input and reduces it in one kernel.

#include "collective_helpers.hpp"
#include "copy_streams.hpp"
#include "kernels.hpp"
#include "reduction.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/error.hpp>

namespace symmpool {

void Communicator::one_shot(const Reduction& r, std::size_t in_count, std::size_t src_offset) {
  const std::size_t in_bytes = in_count * element_size(r.type);
  require_symmetric(r.in, in_bytes, "reduction input");
  const bool fused = fused_reduction(r.bytes());
  detail::ReduceLaunch launch = reduce_launch(r, fused, kOneShotFusedBlocks);
  for (int p = 0; p < world(); ++p) launch.in.ptr[p] = heap_.peer_ptr(r.in, p);
  launch.src_offset = src_offset;
  // Peers read our input until the end: results that would land on it go to
  // scratch first.
  const bool aliased = detail::overlap(r.in, in_bytes, r.out, r.bytes());
  if (aliased) launch.out.ptr[0] = scratch(r.bytes());
  if (!fused) enqueue_barrier(r.stream, BarrierKind::kKernel);
  SYMMPOOL_CUDA_TRY(detail::launch_reduce(launch, r.stream));
  if (!fused) enqueue_barrier(r.stream, BarrierKind::kKernel);
  if (aliased) detail::copy_on(r.stream, r.out, launch.out.ptr[0], r.bytes());
  detail::count_algorithm(Algorithm::kOneShot);
}

}  // namespace symmpool
