// What the reduction algorithms (one_shot.cpp, two_shot.cpp, two_step.cpp) share.

#include <symmpool/communicator.hpp>

namespace symmpool {

float Communicator::scale(ReduceOp op) const {
  return op == ReduceOp::kAvg ? 1.0f / static_cast<float>(world()) : 1.0f;
}

}  // namespace symmpool
