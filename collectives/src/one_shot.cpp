// One-shot reduction, for reduce_scatter and all_reduce: every rank reads
// its part of every peer's input and reduces it in one kernel.

#include "algorithms.hpp"
#include "collective_helpers.hpp"
#include "copy_streams.hpp"
#include "kernels.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/error.hpp>

namespace symmpool::detail {

void one_shot(AlgorithmContext& ctx, const Reduction& r, std::size_t in_count, std::size_t src_offset) {
  const std::size_t in_bytes = in_count * element_size(r.type);
  ctx.require_symmetric(r.in, in_bytes, "reduction input");
  const bool fused = fused_reduction(ctx, r.bytes());
  ReduceLaunch launch = reduce_launch(ctx, r, fused, kOneShotFusedBlocks);
  for (int p = 0; p < ctx.world(); ++p) launch.in.ptr[p] = ctx.peer_ptr(r.in, p);
  launch.src_offset = src_offset;
  // Peers read our input until the end: results that would land on it go to
  // scratch first.
  const bool aliased = overlap(r.in, in_bytes, r.out, r.bytes());
  if (aliased) launch.out.ptr[0] = ctx.scratch(r.bytes());
  if (!fused) ctx.enqueue_barrier(r.stream, BarrierKind::kKernel);
  SYMMPOOL_CUDA_TRY(launch_reduce(launch, r.stream));
  if (!fused) ctx.enqueue_barrier(r.stream, BarrierKind::kKernel);
  if (aliased) copy_on(r.stream, r.out, launch.out.ptr[0], r.bytes());
  count_algorithm(Algorithm::kOneShot);
}

}  // namespace symmpool::detail
