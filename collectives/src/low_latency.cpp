// The low-latency all-reduce: for small messages, one kernel and no barrier
// (NCCL's LL protocol; kernels.hpp says how it stays right). Its packets
// live in the communicator's internal slot, the same offset on every rank,
// so the input and output may be any device memory: nothing is read from a
// peer's buffers, and no symmetry check is needed.

#include "algorithms.hpp"
#include "collective_helpers.hpp"
#include "copy_streams.hpp"
#include "kernels.hpp"

#include <symmpool/error.hpp>

namespace symmpool::detail {

void low_latency_all_reduce(AlgorithmContext& ctx, const Reduction& r) {
  LowLatencyLaunch launch;
  launch.in = r.in;
  launch.out = r.out;
  // A thread reads its input unit and then writes the same unit of the
  // output: in place is safe, an output that overlaps otherwise goes to
  // scratch first (decided locally, so the algorithm stays the same on every rank).
  const bool aliased = r.in != r.out && overlap(r.in, r.bytes(), r.out, r.bytes());
  if (aliased) launch.out = ctx.scratch(r.bytes());
  launch.count = r.count;
  launch.type = r.type;
  launch.scale = r.scale;
  launch.world = ctx.world();
  launch.rank = ctx.rank();
  const LowLatencyPackets packets = ctx.low_latency_packets();
  launch.regions = packets.regions;
  launch.slot_packets = packets.slot_packets;
  launch.epoch = packets.epoch;
  launch.failure = ctx.failure_words();
  // An eager call whose kernel is its last work ends at the end word, with
  // no event to record (Communicator::in_order).
  if (!aliased) launch.end_word = ctx.end_word();
  if (launch.end_word != nullptr) launch.call = ctx.call_number();
  launch_low_latency_all_reduce(launch, r.stream);
  if (launch.end_word != nullptr) ctx.ends_at_word();
  if (aliased) copy_on(r.stream, r.out, launch.out, r.bytes());
  count_algorithm(Algorithm::kLowLatency);
}

}  // namespace symmpool::detail
