// What the reduction algorithms (one_shot.cpp, two_shot.cpp, two_step.cpp) share.

#include "reduction.hpp"

#include <symmpool/algorithm_table.hpp>

#include <algorithm>

namespace symmpool::detail {

static_assert(kTwoShotFusedBlocks <= kMaxSyncBlocks && kOneShotFusedBlocks <= kMaxSyncBlocks,
              "each meeting block has its own row of signal pads");

float reduction_scale(ReduceOp op, int world) {
  return op == ReduceOp::kAvg ? 1.0f / static_cast<float>(world) : 1.0f;
}

ReduceLaunch reduce_launch(AlgorithmContext& ctx, const Reduction& r, bool fused, int fused_blocks) {
  ReduceLaunch launch;
  launch.sync = ctx.block_sync(fused);
  launch.out.ptr[0] = r.out;
  launch.n_outs = 1;
  launch.count = r.count;
  launch.grid_count = r.count;
  launch.world = ctx.world();
  launch.type = r.type;
  launch.scale = r.scale;
  launch.max_blocks = fused ? fused_blocks : ctx.tuning().max_blocks;
  return launch;
}

ChunkOfRank chunk_of_rank(const AlgorithmContext& ctx, std::size_t count, std::size_t element_bytes) {
  const std::size_t n = static_cast<std::size_t>(ctx.world());
  const std::size_t per_vector = 16 / element_bytes;  // loads stay aligned where the buffer is
  const std::size_t stride = ((count + n - 1) / n + per_vector - 1) / per_vector * per_vector;
  const std::size_t first = std::min(count, stride * static_cast<std::size_t>(ctx.rank()));
  return {first, std::min(stride, count - first), stride};
}

}  // namespace symmpool::detail
