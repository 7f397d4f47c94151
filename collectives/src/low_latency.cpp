// The low-latency all-reduce: for small messages, one kernel and no barrier
// (NCCL's LL protocol; kernels.hpp says how it stays right). Its packets
// live in the communicator's internal slot, the same offset on every rank,
// so the input and output may be any device memory: nothing is read from a
// peer's buffers, and no symmetry check is needed.

#include "call_end_word.hpp"
#include "collective_helpers.hpp"
#include "copy_streams.hpp"
#include "kernels.hpp"
#include "reduction.hpp"

#include <symmpool/communicator.hpp>
#include <symmpool/error.hpp>

namespace symmpool {

void Communicator::low_latency_all_reduce(const Reduction& r) {
  detail::LowLatencyLaunch launch;
  launch.in = r.in;
  launch.out = r.out;
  // A thread reads its input unit and then writes the same unit of the
  // output: in place is safe, an output that overlaps otherwise goes to
  // scratch first (decided locally, so the algorithm stays the same on every rank).
  const bool aliased = r.in != r.out && detail::overlap(r.in, r.bytes(), r.out, r.bytes());
  if (aliased) launch.out = scratch(r.bytes());
  launch.count = r.count;
  launch.type = r.type;
  launch.scale = r.scale;
  launch.world = world();
  launch.rank = rank();
  launch.regions = words_.packet_regions;
  launch.slot_packets = tuning_.low_latency_max_bytes / 8;
  launch.epoch = words_.low_latency_epoch;
  launch.failure = failure_words();
  // An eager call whose kernel is its last work ends at the end word, with
  // no event to record (in_order).
  const bool ends_at_word = ends_.word && !aliased && !capturing();
  if (ends_at_word) {
    launch.end_word = ends_.word->for_kernel();
    launch.call = call_.number;
  }
  detail::launch_low_latency_all_reduce(launch, r.stream);
  ends_.at_word = ends_at_word;
  if (aliased) detail::copy_on(r.stream, r.out, launch.out, r.bytes());
  detail::count_algorithm(Algorithm::kLowLatency);
}

void Communicator::set_low_latency_epoch_for_testing(std::uint32_t last) {
  SYMMPOOL_CUDA_TRY(cudaDeviceSynchronize());
  SYMMPOOL_CUDA_TRY(cudaMemcpy(words_.low_latency_epoch, &last, sizeof(last), cudaMemcpyHostToDevice));
}

}  // namespace symmpool
