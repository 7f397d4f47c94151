#include "stream_op_watchdog.hpp"

#include "relaxed_capture.hpp"

#include <symmpool/error.hpp>
#include <symmpool/log.hpp>

#include <cstdio>
#include <exception>
#include <future>

namespace symmpool::detail {

StreamOpWatchdog::StreamOpWatchdog(const DriverApi& drv, int device, int rank, std::uint32_t* barrier_row,
                                   std::uint32_t* signal_row, std::uint64_t* checked_pairs, int world,
                                   const int* error_flag, std::uint32_t* failed_word,
                                   std::chrono::seconds timeout, std::function<void(int)> on_timeout,
                                   std::function<void(int)> on_differing)
    : drv_(drv),
      device_(device),
      error_flag_(error_flag),
      failed_word_(failed_word),
      rank_(rank),
      timeout_(timeout),
      on_timeout_(std::move(on_timeout)),
      on_differing_(std::move(on_differing)) {
  channels_[kBarrierChannel].slots = barrier_row;
  channels_[kBarrierChannel].count = world;
  for (int p = 0; p < world; ++p) {
    Channel& c = channels_[static_cast<std::size_t>(signal_channel(p))];
    c.slots = signal_row + p;
    c.first_rank = p;
    c.count = 1;
  }
  channels_[kCheckedChannel].pairs = checked_pairs;
  channels_[kCheckedChannel].count = world;
  CUdevice dev = 0;
  int wide = 0;
  SYMMPOOL_CU_TRY(drv_, cuDeviceGet(&dev, device));
  SYMMPOOL_CU_TRY(drv_, cuDeviceGetAttribute(&wide, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev));
  checks_calls_ = wide != 0;
  SYMMPOOL_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&words_), kPinnedBytes, cudaHostAllocMapped));
  for (int i = 0; i < kWords; ++i) words_[i] = 0;
  reached_ = words_;
  passed_ = words_ + kChannels;
  seen_ = words_ + 2 * kChannels;
  seen_pairs_ = reinterpret_cast<std::uint64_t*>(words_ + kWords);
  void* device_view = nullptr;
  const cudaError_t mapped = cudaHostGetDevicePointer(&device_view, words_, 0);
  if (mapped != cudaSuccess) cudaFreeHost(words_);
  SYMMPOOL_CUDA_TRY(mapped);
  words_on_device_ = static_cast<std::uint32_t*>(device_view);
  // Stream-op waits without this thread would have no timeout: a watchdog
  // that cannot start fails the communicator that asks for it, here.
  std::future<void> start = started_.get_future();
  thread_ = std::thread([this] { watch(); });
  try {
    start.get();
  } catch (...) {
    thread_.join();  // it returned after failing
    cudaFreeHost(words_);
    throw;
  }
}

StreamOpWatchdog::~StreamOpWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  cudaFreeHost(words_);
}

CUdeviceptr StreamOpWatchdog::on_device(const std::uint32_t* word) const {
  return reinterpret_cast<CUdeviceptr>(words_on_device_ + (word - words_));
}

WatchNotes StreamOpWatchdog::issue(int channel, std::uint32_t value) {
  // Before anything is enqueued: whatever part of it gets enqueued, the
  // thread knows what it waits for (an enqueue that failed fails the
  // communicator, which releases it).
  channels_[static_cast<std::size_t>(channel)].issued.store(value);
  return {on_device(reached_ + channel), on_device(passed_ + channel)};
}

void StreamOpWatchdog::watch() {
  RelaxedCaptureMode relaxed;  // our copies and syncs are legal while the owner's thread captures
  cudaStream_t side = nullptr;
  try {
    SYMMPOOL_CUDA_TRY(cudaSetDevice(device_));
    SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  } catch (...) {
    started_.set_exception(std::current_exception());  // the constructor throws it
    return;
  }
  started_.set_value();
  for (Channel& c : channels_) c.clock.since = Clock::now();
  bool reported = false;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stop_; })) {
    const bool failed = *static_cast<const volatile int*>(error_flag_) != 0;
    for (int i = 0; i < kChannels; ++i) {
      if (channels_[static_cast<std::size_t>(i)].count == 0) continue;  // a peer beyond the world
      try {
        check(channels_[static_cast<std::size_t>(i)], i, failed, side);
      } catch (const std::exception& e) {  // tried again at the next tick
        if (!reported) SYMMPOOL_WARN(kColl, "stream-op watchdog (retrying): %s", e.what());
        reported = true;
      }
    }
  }
  cudaStreamDestroy(side);
}

ChannelVerdict judge_channel(ChannelClock& clock, std::uint32_t issued, std::uint32_t reached,
                             std::uint32_t passed, bool failed, std::chrono::steady_clock::time_point now,
                             std::chrono::seconds timeout) {
  if (passed == issued) {  // idle
    clock.since = now;
    return ChannelVerdict::kWaiting;
  }
  // Every tick while waits remain, not once: a peer's write that lands after
  // a release (its stream got to the meeting later) can take a slot below
  // the awaited value again, and a wait the watchdog had let go would then
  // hold its stream for good.
  if (failed) return ChannelVerdict::kRelease;
  const bool in_waits = reached != passed;  // the GPU sits at the wait for passed + 1
  if (!in_waits || reached != clock.last_reached || passed != clock.last_passed) {
    clock.last_reached = reached;
    clock.last_passed = passed;
    clock.since = now;
    return ChannelVerdict::kWaiting;
  }
  if (now - clock.since < timeout) return ChannelVerdict::kWaiting;
  clock.since = now;
  return ChannelVerdict::kTimedOut;
}

void StreamOpWatchdog::check(Channel& c, int index, bool failed, cudaStream_t side) {
  const std::uint32_t issued = c.issued.load();
  const std::uint32_t reached = static_cast<volatile std::uint32_t*>(reached_)[index];
  const std::uint32_t passed = static_cast<volatile std::uint32_t*>(passed_)[index];
  switch (judge_channel(c.clock, issued, reached, passed, failed, Clock::now(), timeout_)) {
    case ChannelVerdict::kWaiting:
      return;
    case ChannelVerdict::kRelease:  // a throw: again at the next tick
      if (c.pairs)
        release_pairs(c, issued, /*blame=*/false, side);
      else
        release(c, issued, /*blame=*/false, side);
      return;
    case ChannelVerdict::kTimedOut:
      // Waits on one channel pass in the order issued (barriers follow the
      // issue order; signals from one peer are waited for in one order), so
      // the one stalled is the first after the last that passed: a rank is
      // to blame when its slot has not reached that one's value.
      if (c.pairs)
        release_pairs(c, passed + 1, /*blame=*/true, side);
      else
        release(c, passed + 1, /*blame=*/true, side);
      return;
  }
}

PairVerdict judge_pair(std::uint64_t low, std::uint64_t high, std::uint32_t epoch, std::uint32_t digest) {
  if (static_cast<std::int32_t>(static_cast<std::uint32_t>(low >> 32) - epoch) < 0)
    return PairVerdict::kMissing;
  const bool passes = static_cast<std::int64_t>(low - checked_low(epoch, digest)) >= 0 &&
                      static_cast<std::int64_t>(high - checked_high(epoch, digest)) >= 0;
  return passes ? PairVerdict::kArrived : PairVerdict::kAtAnotherCall;
}

void StreamOpWatchdog::release_pairs(Channel& channel, std::uint32_t epoch, bool blame, cudaStream_t side) {
  const std::uint32_t issued = channel.issued.load();
  const auto bytes = static_cast<std::size_t>(channel.count) * 2 * sizeof(std::uint64_t);
  SYMMPOOL_CUDA_TRY(cudaMemcpyAsync(seen_pairs_, channel.pairs, bytes, cudaMemcpyDeviceToHost, side));
  SYMMPOOL_CUDA_TRY(cudaStreamSynchronize(side));
  // Our own pair holds our values of the meeting our stream sits at: our digest.
  const std::uint64_t ours = seen_pairs_[2 * rank_];
  const bool ours_known = static_cast<std::uint32_t>(ours >> 32) == epoch;
  const auto digest = static_cast<std::uint32_t>(ours);
  StreamOpBatch batch;
  for (int r = 0; r < channel.count; ++r) {
    PairVerdict verdict = judge_pair(seen_pairs_[2 * r], seen_pairs_[2 * r + 1], epoch, digest);
    // Without our digest only the epochs tell: a rank that reached the meeting is not blamed.
    if (!ours_known && verdict == PairVerdict::kAtAnotherCall) verdict = PairVerdict::kArrived;
    if (blame && verdict == PairVerdict::kArrived) continue;
    if (blame) {
      // On record (or the process aborted) before the stream goes on.
      if (verdict == PairVerdict::kAtAnotherCall)
        on_differing_(r);
      else
        on_timeout_(r);
    }
    // The largest values of the last meeting issued: every wait issued passes.
    const CUdeviceptr pair = reinterpret_cast<CUdeviceptr>(channel.pairs + 2 * r);
    batch.write64(pair, checked_low(issued, ~std::uint32_t{0}));
    batch.write64(pair + sizeof(std::uint64_t), checked_high(issued, 0));
  }
  if (batch.size() == 0) return;
  // The kernels told first (stream order on `side`): whatever failed, the
  // kernels after these waits leave peers alone.
  SYMMPOOL_CU_TRY(drv_, cuStreamWriteValue32(reinterpret_cast<CUstream>(side),
                                             reinterpret_cast<CUdeviceptr>(failed_word_), 1,
                                             CU_STREAM_WRITE_VALUE_DEFAULT));
  batch.enqueue(drv_, reinterpret_cast<CUstream>(side));
  SYMMPOOL_CUDA_TRY(cudaStreamSynchronize(side));
}

void StreamOpWatchdog::release(Channel& channel, std::uint32_t below, bool blame, cudaStream_t side) {
  const std::uint32_t issued = channel.issued.load();
  const auto bytes = static_cast<std::size_t>(channel.count) * sizeof(std::uint32_t);
  SYMMPOOL_CUDA_TRY(cudaMemcpyAsync(seen_, channel.slots, bytes, cudaMemcpyDeviceToHost, side));
  SYMMPOOL_CUDA_TRY(cudaStreamSynchronize(side));
  bool kernels_told = false;
  for (int i = 0; i < channel.count; ++i) {
    if (static_cast<std::int32_t>(seen_[i] - below) >= 0) continue;
    // On record (or the process aborted) before the stream goes on, and
    // the kernels told (stream order on `side`, once a release) before the
    // waits pass: whatever failed, the kernels after these waits leave peers alone.
    if (blame) on_timeout_(channel.first_rank + i);
    if (!kernels_told)
      SYMMPOOL_CU_TRY(drv_, cuStreamWriteValue32(reinterpret_cast<CUstream>(side),
                                                 reinterpret_cast<CUdeviceptr>(failed_word_), 1,
                                                 CU_STREAM_WRITE_VALUE_DEFAULT));
    kernels_told = true;
    SYMMPOOL_CU_TRY(drv_, cuStreamWriteValue32(reinterpret_cast<CUstream>(side),
                                               reinterpret_cast<CUdeviceptr>(channel.slots + i), issued,
                                               CU_STREAM_WRITE_VALUE_DEFAULT));
  }
  SYMMPOOL_CUDA_TRY(cudaStreamSynchronize(side));
}

}  // namespace symmpool::detail
