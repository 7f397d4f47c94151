// What the reduction algorithms (one_shot.cpp, two_shot.cpp, two_step.cpp) share.

#include "reduction.hpp"

#include "kernels.hpp"

#include <symmpool/communicator.hpp>

namespace symmpool {

float Communicator::scale(ReduceOp op) const {
  return op == ReduceOp::kAvg ? 1.0f / static_cast<float>(world()) : 1.0f;
}

detail::ReduceLaunch Communicator::reduce_launch(const Reduction& r, bool fused) const {
  detail::ReduceLaunch launch;
  launch.sync = block_sync(fused);
  launch.out.ptr[0] = r.out;
  launch.n_outs = 1;
  launch.count = r.count;
  launch.grid_count = r.count;
  launch.world = world();
  launch.type = r.type;
  launch.scale = r.scale;
  launch.max_blocks = max_blocks_;
  return launch;
}

}  // namespace symmpool
