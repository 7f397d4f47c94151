// What the reduction algorithms (one_shot.cpp, two_shot.cpp, two_step.cpp) share.

#include "reduction.hpp"

#include "kernels.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/communicator.hpp>

#include <algorithm>

namespace symmpool {

static_assert(kTwoShotFusedBlocks <= detail::kMaxSyncBlocks && kOneShotFusedBlocks <= detail::kMaxSyncBlocks,
              "each meeting block has its own row of signal pads");

float Communicator::scale(ReduceOp op) const {
  return op == ReduceOp::kAvg ? 1.0f / static_cast<float>(world()) : 1.0f;
}

detail::ReduceLaunch Communicator::reduce_launch(const Reduction& r, bool fused, int fused_blocks) {
  detail::ReduceLaunch launch;
  launch.sync = block_sync(fused);
  launch.out.ptr[0] = r.out;
  launch.n_outs = 1;
  launch.count = r.count;
  launch.grid_count = r.count;
  launch.world = world();
  launch.type = r.type;
  launch.scale = r.scale;
  launch.max_blocks = fused ? fused_blocks : tuning_.max_blocks;
  return launch;
}

Communicator::ChunkOfRank Communicator::chunk_of_rank(std::size_t count, std::size_t element_bytes) const {
  const std::size_t n = static_cast<std::size_t>(world());
  const std::size_t per_vector = 16 / element_bytes;  // loads stay aligned where the buffer is
  const std::size_t stride = ((count + n - 1) / n + per_vector - 1) / per_vector * per_vector;
  const std::size_t first = std::min(count, stride * static_cast<std::size_t>(rank()));
  return {first, std::min(stride, count - first), stride};
}

}  // namespace symmpool
