// Peer memory for the patterns users write themselves: ranges checked
// symmetric once (rendezvous), their peers' copies as mapped here, and
// point-to-point signals on the signal pads (stream memops eagerly, kernels
// in CUDA graphs).

#include "capture_state.hpp"
#include "event_pool.hpp"
#include "failure_monitor.hpp"
#include "kernels.hpp"
#include "relaxed_capture.hpp"
#include "stream_op_batch.hpp"
#include "stream_op_watchdog.hpp"

#include <symmpool/communicator.hpp>
#include <symmpool/error.hpp>

#include <cstdint>
#include <string>

namespace symmpool {

void Communicator::rendezvous(const void* ptr, std::size_t bytes, cudaStream_t stream) {
  SYMMPOOL_EXPECTS(bytes > 0, "symmpool rendezvous on rank " + std::to_string(rank()) + ": an empty buffer");
  check_errors();
  begin_call("rendezvous");
  bool synced = false;
  try {
    detail::RelaxedCaptureMode relaxed;  // may map peer segments: allowed under capture
    SymmetricHeap::DeviceWaitsForbidden no_waits(heap_, detail::is_capturing(stream));
    // Every rank exchanges, even with a buffer outside its heap: a rank that
    // passed plain memory fails every rank at once instead of leaving its
    // peers waiting for it.
    heap_.check_symmetric_and_sync(ptr, bytes, call_label() + " buffer", /*sync_if_needed=*/true, &synced,
                                   SymmetricHeap::Extent::kOneLiveAllocation);
  } catch (const not_symmetric_error&) {
    if (synced) verdicts_.checked.clear();
    call_.exchange_next_check = false;
    throw;  // the same verdict on every rank
  } catch (const logic_error&) {
    throw;
  } catch (const std::exception& e) {
    monitor_->fail("rendezvous of " + std::to_string(bytes) + " bytes: " + e.what());
    throw collective_error(monitor_->record_of_failure()->message());
  }
  if (synced) verdicts_.checked.clear();
  call_.exchange_next_check = false;
  rendezvoused_.add(ptr, bytes);
}

void Communicator::check_rendezvoused(const void* ptr, std::size_t bytes, int peer) const {
  check_peer(peer, "peer_address");
  const std::string why_not = rendezvoused_.why_not_covered(ptr, bytes);
  SYMMPOOL_EXPECTS(why_not.empty(),
                   "symmpool peer_address on rank " + std::to_string(rank()) + ": " + why_not);
}

void* Communicator::peer_address(const void* ptr, std::size_t bytes, int peer) const {
  check_rendezvoused(ptr, bytes, peer);
  return heap_.peer_ptr(ptr, peer, bytes);
}

std::pair<void*, std::shared_ptr<void>> Communicator::peer_view(const void* ptr, std::size_t bytes,
                                                                int peer) const {
  check_rendezvoused(ptr, bytes, peer);
  return heap_.peer_view(ptr, peer, bytes);
}

void Communicator::signal(int peer, cudaStream_t stream) {
  const auto cu = reinterpret_cast<CUstream>(stream);
  point_to_point(
      "signal", peer, stream,
      [&] {  // our count of eager signals to `peer`, written into its pad (a release: the write fences)
        auto* slot = words_.peer_pads.peer[peer] + detail::kStreamOpSignalRow * kMaxRanks + rank();
        const std::uint32_t count = stream_ops_.sent[static_cast<std::size_t>(peer)] + 1;
        SYMMPOOL_CU_TRY(real_driver(), cuStreamWriteValue32(cu, reinterpret_cast<CUdeviceptr>(slot), count,
                                                            CU_STREAM_WRITE_VALUE_DEFAULT));
        stream_ops_.sent[static_cast<std::size_t>(peer)] = count;
      },
      [&] { return detail::launch_signal(peer_signals(), peer, words_.signals_sent, stream); });
}

void Communicator::wait(int peer, cudaStream_t stream) {
  const auto cu = reinterpret_cast<CUstream>(stream);
  point_to_point(
      "wait", peer, stream,
      [&] {  // until `peer`'s count of eager signals to us reaches one more than we consumed
        detail::StreamOpWatchdog& watchdog = stream_op_watchdog();  // before the wait it times out
        auto* slot = words_.pads + detail::kStreamOpSignalRow * kMaxRanks + peer;
        const std::uint32_t count = stream_ops_.received[static_cast<std::size_t>(peer)] + 1;
        detail::StreamOpBatch batch;  // the wait and the watchdog's notes: one driver call
        detail::add_watched_wait(batch, reinterpret_cast<CUdeviceptr>(slot), count,
                                 watchdog.issue(detail::StreamOpWatchdog::signal_channel(peer), count));
        batch.enqueue(real_driver(), cu);
        stream_ops_.received[static_cast<std::size_t>(peer)] = count;
      },
      [&] { return detail::launch_wait(peer_signals(), peer, words_.signals_received, stream); });
}

// Not in the issue order (signals and waits of two ranks pair up across
// streams; ordering them behind the collectives could deadlock), but on
// record, numbered apart from the collectives, so a wait that never passed
// is named by the failure.
void Communicator::point_to_point(const char* op, int peer, cudaStream_t stream,
                                  const std::function<void()>& stream_ops,
                                  const std::function<cudaError_t()>& kernel) {
  check_peer(peer, op);
  check_errors();
  // An invalidated capture takes the kernel path too: its enqueue fails with
  // a CUDA error that leaves the communicator sound (no stream-op count moved).
  const bool captured = detail::is_capturing(stream);
  if (captured) {  // a kernel that was not captured changed no count, here or at the peer
    SYMMPOOL_CUDA_TRY(kernel());
    monitor_->record_point_to_point(op, peer, nullptr, captured);
    return;
  }
  try {
    stream_ops();
    monitor_->record_point_to_point(op, peer, ends_.events->record(stream), captured);
  } catch (const std::exception& e) {
    monitor_->fail(std::string(op) + (std::string(op) == "wait" ? " from" : " to") + " rank " +
                   std::to_string(peer) + ": " + e.what());
    throw collective_error(monitor_->record_of_failure()->message());
  }
}

void Communicator::check_peer(int peer, const char* op) const {
  SYMMPOOL_EXPECTS(peer >= 0 && peer < world(),
                   std::string("symmpool ") + op + " on rank " + std::to_string(rank()) + ": peer " +
                       std::to_string(peer) + " is not in the group of " + std::to_string(world()));
}

}  // namespace symmpool
