// What the algorithms see of a call (detail::AlgorithmContext) that the
// core does not serve elsewhere: peers' copies of buffers, the call's copy
// lanes and pipeline, the low-latency packets and the call end word.
// Meetings are in barrier.cpp, scratch in scratch.cpp, symmetry checks in
// communicator.cpp.

#include "call_end_word.hpp"
#include "capture_state.hpp"
#include "copy_streams.hpp"
#include "stream_pipeline.hpp"

#include <symmpool/communicator.hpp>
#include <symmpool/error.hpp>

namespace symmpool {

void* Communicator::peer_ptr(const void* ptr, int peer) const { return heap_.peer_ptr(ptr, peer); }

detail::CopyStreams& Communicator::copy_streams() { return copies_->for_call(capturing()); }

detail::StreamPipeline& Communicator::pipeline() { return pipelines_->for_call(capturing()); }

detail::LowLatencyPackets Communicator::low_latency_packets() const {
  return {words_.packet_regions, tuning_.low_latency_max_bytes / 8, words_.low_latency_epoch};
}

std::uint64_t* Communicator::end_word() const {
  return ends_.word && !capturing() ? ends_.word->for_kernel() : nullptr;
}

void Communicator::set_low_latency_epoch_for_testing(std::uint32_t last) {
  SYMMPOOL_CUDA_TRY(cudaDeviceSynchronize());
  SYMMPOOL_CUDA_TRY(cudaMemcpy(words_.low_latency_epoch, &last, sizeof(last), cudaMemcpyHostToDevice));
}

}  // namespace symmpool
