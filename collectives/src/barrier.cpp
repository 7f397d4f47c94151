// Barriers and the signal pads they meet on: a kernel or stream memory
// operations (SM-free) between the steps of a collective, the BlockSync
// that lets a kernel meet its peers itself, and the watchdog that times out
// stream-memop waits.

#include "failure_monitor.hpp"
#include "kernels.hpp"
#include "relaxed_capture.hpp"
#include "stream_op_batch.hpp"
#include "stream_op_watchdog.hpp"

#include <symmpool/communicator.hpp>
#include <symmpool/detail/scope_exit.hpp>
#include <symmpool/error.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>

namespace symmpool {

namespace {

constexpr std::size_t kPadWords = std::size_t{detail::kPadRows} * detail::kMaxRanks;
constexpr std::size_t kPadBytes = kPadWords * sizeof(std::uint32_t);
// The kernel barrier's epoch, the block meetings' epochs, then the signals
// this rank sent to and received from each peer.
constexpr std::size_t kEpochBytes =
    (1 + detail::kMaxSyncBlocks + 2 * detail::kMaxRanks) * sizeof(std::uint32_t);
static_assert(kPadBytes + kEpochBytes <= 4096, "pads and epochs fit in any internal slot");

}  // namespace

void Communicator::allocate_signal_pads() {
  internal_ = heap_.allocate_internal();  // collective: the same offset on every rank
  pads_ = static_cast<std::uint32_t*>(internal_);
  kernel_epoch_ = pads_ + kPadWords;
  block_epochs_ = kernel_epoch_ + 1;
  signals_sent_ = block_epochs_ + detail::kMaxSyncBlocks;
  signals_received_ = signals_sent_ + detail::kMaxRanks;
  cudaStream_t setup = nullptr;  // private: a device-wide sync would break a capture
  SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&setup, cudaStreamNonBlocking));
  detail::ScopeExit destroy([setup] { cudaStreamDestroy(setup); });
  SYMMPOOL_CUDA_TRY(cudaMemsetAsync(pads_, 0, kPadBytes + kEpochBytes, setup));
  SYMMPOOL_CUDA_TRY(cudaStreamSynchronize(setup));
}

void Communicator::map_signal_pads() {
  heap_.check_symmetric(pads_, kPadBytes, "signal pads");  // by construction; checked all the same
  // Fixed for the communicator's life; asking per call cost ~1 ms of host
  // time (the clock-rate query), measured on H200.
  for (int p = 0; p < world(); ++p)
    peer_pads_.peer[p] = static_cast<std::uint32_t*>(heap_.peer_ptr(pads_, p));
  int khz = 0;
  SYMMPOOL_CUDA_TRY(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, allocator_.device()));
  timeout_cycles_ = static_cast<long long>(khz) * 1000LL * timeout_seconds_;
}

detail::PeerSignals Communicator::peer_signals() const {
  detail::PeerSignals s;
  s.peers = peer_pads_;
  s.my_pads = pads_;
  s.rank = rank();
  s.error_flag = error_flag_;
  s.timeout_cycles = timeout_cycles_;
  return s;
}

detail::BlockSync Communicator::block_sync(bool fused) const {
  detail::BlockSync s;
  s.enabled = fused;
  s.signals = peer_signals();
  s.block_epochs = block_epochs_;
  return s;
}

void Communicator::barrier(cudaStream_t stream, BarrierKind kind) {
  check_errors();
  begin_call("barrier");
  in_order(stream, "barrier", 0, [&] { enqueue_barrier(stream, kind); });
}

void Communicator::enqueue_barrier(cudaStream_t stream, BarrierKind kind) {
  const int n = world();
  // Stream-op barriers carry an epoch counted on the host, which a graph
  // would replay unchanged (every replay after the first would pass at
  // once); captured barriers count on the device instead.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SYMMPOOL_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
  if (kind == BarrierKind::kKernel || capture != cudaStreamCaptureStatusNone) {
    SYMMPOOL_CUDA_TRY(detail::launch_barrier(peer_signals(), n, kernel_epoch_, stream));
    return;
  }
  // SM-free: write our epoch into each peer's pad, then wait on our own
  // (the watchdog first: no wait may be enqueued without its timeout).
  detail::StreamOpWatchdog& watchdog = stream_op_watchdog();
  const DriverApi& drv = real_driver();
  const std::uint32_t epoch = ++stream_op_epoch_;
  auto cu = reinterpret_cast<CUstream>(stream);
  constexpr int row = detail::kStreamOpBarrierRow * kMaxRanks;
  std::array<CUdeviceptr, kMaxRanks> to_peers{}, mine{};
  for (int p = 0; p < n; ++p) {
    to_peers[static_cast<std::size_t>(p)] = reinterpret_cast<CUdeviceptr>(peer_pads_.peer[p] + row + rank());
    mine[static_cast<std::size_t>(p)] = reinterpret_cast<CUdeviceptr>(pads_ + row + p);
  }
  detail::StreamOpBatch batch;  // one driver call for the whole barrier
  detail::add_barrier(batch, to_peers.data(), mine.data(), n, epoch,
                      watchdog.issue(detail::StreamOpWatchdog::kBarrierChannel, epoch));
  batch.enqueue(drv, cu);
}

detail::StreamOpWatchdog& Communicator::stream_op_watchdog() {
  if (!watchdog_) {
    detail::RelaxedCaptureMode relaxed;  // cudaHostAlloc is refused while another stream captures
    constexpr int kBarrierRow = detail::kStreamOpBarrierRow * kMaxRanks;
    constexpr int kSignalRow = detail::kStreamOpSignalRow * kMaxRanks;
    watchdog_ = std::make_unique<detail::StreamOpWatchdog>(
        real_driver(), allocator_.device(), pads_ + kBarrierRow, pads_ + kSignalRow, world(), error_flag_,
        std::chrono::seconds(timeout_seconds_), [this](int missing) { monitor_->fail_missing(missing); });
  }
  return *watchdog_;
}

}  // namespace symmpool
