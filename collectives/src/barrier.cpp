// Barriers and the signal pads they meet on: a kernel or stream memory
// operations (SM-free) between the steps of a collective, the BlockSync
// that lets a kernel meet its peers itself, and the watchdog that times out
// stream-memop waits.

#include "call_check.hpp"
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
// The kernel barrier's epoch, the block meetings' epochs, the signals this
// rank sent to and received from each peer, the low-latency epoch and its
// count of blocks done, then the failed word.
constexpr std::size_t kEpochBytes =
    (1 + detail::kMaxSyncBlocks + 2 * detail::kMaxRanks + 2 + 1) * sizeof(std::uint32_t);
// The low-latency packets fill the rest of the slot (one granule).
constexpr std::size_t kPacketsOffset = 16384;
static_assert(kPadBytes + kEpochBytes <= detail::kStartWordsOffset,
              "pads and epochs come before the start words");
static_assert(detail::kCheckedPairsOffset + std::size_t{detail::kMaxRanks} * 16 <= kPacketsOffset,
              "the start words, call words and checked pairs come before the packets");

// Bytes per rank whose packets fit in `slot_bytes`: two regions of `world`
// slots, each packet (16 bytes) carrying 8 bytes.
std::size_t low_latency_capacity(std::size_t slot_bytes, int world) {
  if (slot_bytes <= kPacketsOffset) return 0;
  const std::size_t per_slot = (slot_bytes - kPacketsOffset) / (2 * static_cast<std::size_t>(world));
  const std::size_t fits = per_slot / detail::kPacketBytes * 8;
  return fits < Communicator::kLowLatencyMaxBytes ? fits : Communicator::kLowLatencyMaxBytes;
}

// A rank's checked pairs and call words in the pads `pads` (ours or a
// peer's, as mapped here): peer_pointers.hpp's layout.
std::uint64_t* checked_pairs_of(std::uint32_t* pads) {
  return reinterpret_cast<std::uint64_t*>(reinterpret_cast<char*>(pads) + detail::kCheckedPairsOffset);
}
std::uint64_t* call_words_of(std::uint32_t* pads) {
  return reinterpret_cast<std::uint64_t*>(reinterpret_cast<char*>(pads) + detail::kCallWordsOffset);
}

}  // namespace

void Communicator::allocate_signal_pads() {
  words_.internal = heap_.allocate_internal();  // collective: the same offset on every rank
  words_.pads = static_cast<std::uint32_t*>(words_.internal);
  words_.kernel_epoch = words_.pads + kPadWords;
  words_.block_epochs = words_.kernel_epoch + 1;
  words_.signals_sent = words_.block_epochs + detail::kMaxSyncBlocks;
  words_.signals_received = words_.signals_sent + detail::kMaxRanks;
  words_.low_latency_epoch = words_.signals_received + detail::kMaxRanks;
  words_.failed_word = words_.low_latency_epoch + 2;
  const std::size_t slot_bytes = allocator_.granularity();  // an internal slot is one granule
  words_.packets = static_cast<char*>(words_.internal) + kPacketsOffset;
  tuning_.low_latency_max_bytes = low_latency_capacity(slot_bytes, world());
  cudaStream_t setup = nullptr;  // private: a device-wide sync would break a capture
  SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&setup, cudaStreamNonBlocking));
  detail::ScopeExit destroy([setup] { cudaStreamDestroy(setup); });
  // All of it: a packet left over in fresh memory could carry a flag a call expects.
  SYMMPOOL_CUDA_TRY(cudaMemsetAsync(words_.pads, 0, slot_bytes, setup));
  SYMMPOOL_CUDA_TRY(cudaStreamSynchronize(setup));
}

void Communicator::map_signal_pads() {
  heap_.check_symmetric(words_.pads, kPadBytes, "signal pads");  // by construction; checked all the same
  // Fixed for the communicator's life: asked per call, the clock-rate query
  // (a slow driver call) would add its host time to every call.
  for (int p = 0; p < world(); ++p)
    words_.peer_pads.peer[p] = static_cast<std::uint32_t*>(heap_.peer_ptr(words_.pads, p));
  if (tuning_.low_latency_max_bytes > 0)
    for (int p = 0; p < world(); ++p)
      words_.packet_regions.ptr[p] = heap_.peer_ptr(
          words_.packets, p, 4 * static_cast<std::size_t>(world()) * tuning_.low_latency_max_bytes);
  int khz = 0;
  SYMMPOOL_CUDA_TRY(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, allocator_.device()));
  tuning_.timeout_cycles = static_cast<long long>(khz) * 1000LL * tuning_.timeout_seconds;
}

detail::FailureWords Communicator::failure_words() const {
  detail::FailureWords f;
  f.error_flag = words_.error_flag;
  f.failed = words_.failed_word;
  f.timeout_cycles = tuning_.timeout_cycles;
  return f;
}

detail::PeerSignals Communicator::peer_signals() const {
  detail::PeerSignals s;
  s.peers = words_.peer_pads;
  s.my_pads = words_.pads;
  s.rank = rank();
  s.failure = failure_words();
  return s;
}

detail::BlockSync Communicator::block_sync(bool fused) {
  detail::BlockSync s;
  s.enabled = fused;
  s.signals = peer_signals();
  if (fused) {
    s.signals.call = call_.check->take();
    s.signals.call_number = call_.check->number();
  }
  s.block_epochs = words_.block_epochs;
  return s;
}

void Communicator::barrier(cudaStream_t stream, BarrierKind kind) {
  check_errors();
  begin_call("barrier");
  // No digest: a call of one meeting cannot compare one. A peer past it may
  // already have written its next call's digest; the calls that move data
  // meet at least twice, so a peer can write its next digest only after
  // this rank's second signal, sent once this rank has compared.
  call_.check->take();
  in_order(stream, "barrier", 0, [&] { enqueue_barrier(stream, kind); });
}

void Communicator::enqueue_barrier(cudaStream_t stream, BarrierKind kind) {
  const int n = world();
  // A call's first meeting compares the call's digest: a kernel barrier
  // at once, a stream-op one as a checked meeting (whose wait a digest that
  // differs holds until the watchdog's timeout tells it).
  const std::uint32_t call = call_.check->take();
  // Stream-op barriers carry an epoch counted on the host, which a graph
  // would replay unchanged (every replay after the first would pass at
  // once); captured barriers count on the device instead.
  if (kind == BarrierKind::kKernel || capturing()) {
    detail::PeerSignals signals = peer_signals();
    signals.call = call;
    signals.call_number = call_.check->number();
    SYMMPOOL_CUDA_TRY(detail::launch_barrier(signals, n, words_.kernel_epoch, stream));
    return;
  }
  // SM-free: write our epoch into each peer's pad, then wait on our own
  // (the watchdog first: no wait may be enqueued without its timeout).
  detail::StreamOpWatchdog& watchdog = stream_op_watchdog();
  if (call != 0 && !watchdog.checks_calls()) {  // the first meeting must compare: a kernel does
    detail::PeerSignals signals = peer_signals();
    signals.call = call;
    signals.call_number = call_.check->number();
    SYMMPOOL_CUDA_TRY(detail::launch_barrier(signals, n, words_.kernel_epoch, stream));
    return;
  }
  std::array<CUdeviceptr, kMaxRanks> to_peers{}, mine{};
  detail::StreamOpBatch batch;  // one driver call for the whole barrier
  if (call != 0) {
    // A call's first meeting compares the ranks' digests as it meets:
    // a checked meeting, on its own epochs and pairs of 64-bit words.
    const std::uint32_t epoch = ++stream_ops_.checked_epoch;
    std::array<CUdeviceptr, kMaxRanks> call_words{};
    for (int p = 0; p < n; ++p) {
      const auto i = static_cast<std::size_t>(p);
      to_peers[i] = reinterpret_cast<CUdeviceptr>(checked_pairs_of(words_.peer_pads.peer[p]) + 2 * rank());
      mine[i] = reinterpret_cast<CUdeviceptr>(checked_pairs_of(words_.pads) + 2 * p);
      call_words[i] = reinterpret_cast<CUdeviceptr>(call_words_of(words_.peer_pads.peer[p]) + rank());
    }
    detail::add_checked_meeting(batch, to_peers.data(), mine.data(), call_words.data(), n, epoch, call,
                                call_.check->number(),
                                watchdog.issue(detail::StreamOpWatchdog::kCheckedChannel, epoch));
  } else {
    const std::uint32_t epoch = ++stream_ops_.epoch;
    constexpr int row = detail::kStreamOpBarrierRow * kMaxRanks;
    for (int p = 0; p < n; ++p) {
      to_peers[static_cast<std::size_t>(p)] =
          reinterpret_cast<CUdeviceptr>(words_.peer_pads.peer[p] + row + rank());
      mine[static_cast<std::size_t>(p)] = reinterpret_cast<CUdeviceptr>(words_.pads + row + p);
    }
    detail::add_barrier(batch, to_peers.data(), mine.data(), n, epoch,
                        watchdog.issue(detail::StreamOpWatchdog::kBarrierChannel, epoch));
  }
  batch.enqueue(real_driver(), reinterpret_cast<CUstream>(stream));
}

detail::StreamOpWatchdog& Communicator::stream_op_watchdog() {
  if (!watchdog_) {
    detail::RelaxedCaptureMode relaxed;  // cudaHostAlloc is refused while another stream captures
    constexpr int kBarrierRow = detail::kStreamOpBarrierRow * kMaxRanks;
    constexpr int kSignalRow = detail::kStreamOpSignalRow * kMaxRanks;
    watchdog_ = std::make_unique<detail::StreamOpWatchdog>(
        real_driver(), allocator_.device(), rank(), words_.pads + kBarrierRow, words_.pads + kSignalRow,
        checked_pairs_of(words_.pads), world(), words_.error_flag, words_.failed_word,
        std::chrono::seconds(tuning_.timeout_seconds),
        [this](int missing) { monitor_->fail_missing(missing); },
        [this](int differing) { monitor_->fail_differing(differing); });
  }
  return *watchdog_;
}

}  // namespace symmpool
