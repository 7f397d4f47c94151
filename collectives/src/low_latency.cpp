// The low-latency all-reduce: for small messages, one kernel and no barrier
// (NCCL's LL protocol; kernels.hpp says how it stays right). Its packets
// live in the communicator's internal slot, the same offset on every rank,
// so the input and output may be any device memory: nothing is read from a
// peer's buffers, and no symmetry check is needed.

#include "collective_helpers.hpp"
#include "kernels.hpp"
#include "reduction.hpp"

#include <symmpool/communicator.hpp>
#include <symmpool/error.hpp>

namespace symmpool {

void Communicator::low_latency_all_reduce(const Reduction& r) {
  detail::LowLatencyLaunch launch;
  launch.in = r.in;
  launch.out = r.out;
  launch.count = r.count;
  launch.type = r.type;
  launch.scale = r.scale;
  launch.world = world();
  launch.rank = rank();
  launch.regions = packet_regions_;
  launch.slot_packets = low_latency_max_bytes_ / 8;
  launch.epoch = low_latency_epoch_;
  launch.error_flag = error_flag_;
  launch.timeout_cycles = timeout_cycles_;
  SYMMPOOL_CUDA_TRY(detail::launch_low_latency_all_reduce(launch, r.stream));
  detail::count_algorithm(Algorithm::kLowLatency);
}

}  // namespace symmpool
