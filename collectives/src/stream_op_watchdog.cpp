#include "stream_op_watchdog.hpp"

#include <symmpool/error.hpp>

#include <cstdio>
#include <exception>
#include <vector>

namespace symmpool::detail {

StreamOpWatchdog::StreamOpWatchdog(const DriverApi& drv, int device, std::uint32_t* barrier_row,
                                   std::uint32_t* signal_row, int world, const int* error_flag,
                                   std::chrono::seconds timeout, std::function<void(int)> on_timeout)
    : drv_(drv),
      device_(device),
      error_flag_(error_flag),
      timeout_(timeout),
      on_timeout_(std::move(on_timeout)) {
  channels_[kBarrierChannel].slots = barrier_row;
  channels_[kBarrierChannel].count = world;
  for (int p = 0; p < world; ++p) {
    Channel& c = channels_[static_cast<std::size_t>(signal_channel(p))];
    c.slots = signal_row + p;
    c.first_rank = p;
    c.count = 1;
  }
  channel_count_ = 1 + world;
  SYMMPOOL_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&passed_), kChannels * sizeof(std::uint32_t),
                                  cudaHostAllocMapped));
  for (int i = 0; i < kChannels; ++i) passed_[i] = 0;
  void* device_view = nullptr;
  SYMMPOOL_CUDA_TRY(cudaHostGetDevicePointer(&device_view, passed_, 0));
  passed_on_device_ = reinterpret_cast<CUdeviceptr>(device_view);
  thread_ = std::thread([this] { watch(); });
}

StreamOpWatchdog::~StreamOpWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  cudaFreeHost(passed_);
}

void StreamOpWatchdog::enqueue_passed(int channel, CUstream stream, std::uint32_t value) {
  channels_[static_cast<std::size_t>(channel)].issued.store(value);
  SYMMPOOL_CU_TRY(drv_, cuStreamWriteValue32(stream, passed_on_device_ + channel * sizeof(std::uint32_t),
                                             value, CU_STREAM_WRITE_VALUE_DEFAULT));
}

void StreamOpWatchdog::watch() {
  cudaStream_t side = nullptr;
  try {
    SYMMPOOL_CUDA_TRY(cudaSetDevice(device_));
    SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    for (int i = 0; i < channel_count_; ++i) channels_[static_cast<std::size_t>(i)].since = Clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stop_; })) {
      const bool failed = *static_cast<const volatile int*>(error_flag_) != 0;
      for (int i = 0; i < channel_count_; ++i) {
        Channel& c = channels_[static_cast<std::size_t>(i)];
        const std::uint32_t passed = static_cast<volatile std::uint32_t*>(passed_)[i];
        if (passed == c.issued.load() || (passed != c.last_passed && !failed)) {  // idle, or moving
          c.last_passed = passed;
          c.since = Clock::now();
        } else if (failed || Clock::now() - c.since >= timeout_) {
          release_stalled(c, passed, side);
          c.since = Clock::now();
        }
      }
    }
  } catch (const std::exception& e) {
    // No caller to throw to: say why stream-op waits lost their timeout.
    std::fprintf(stderr, "symmpool: stream-op watchdog stopped: %s\n", e.what());
  }
  if (side) cudaStreamDestroy(side);
}

// Waits on one channel pass in the order issued (barriers follow the issue
// order; signals from one peer are waited for in one order), so the one
// stalled is the first after the last that passed: a rank is to blame when
// its slot has not reached that one's value.
void StreamOpWatchdog::release_stalled(Channel& channel, std::uint32_t passed, cudaStream_t side) {
  const std::uint32_t waiting_for = passed + 1;
  const std::uint32_t issued = channel.issued.load();
  std::vector<std::uint32_t> seen(static_cast<std::size_t>(channel.count));
  SYMMPOOL_CUDA_TRY(cudaMemcpyAsync(seen.data(), channel.slots, seen.size() * sizeof(std::uint32_t),
                                    cudaMemcpyDeviceToHost, side));
  SYMMPOOL_CUDA_TRY(cudaStreamSynchronize(side));
  for (int i = 0; i < channel.count; ++i) {
    if (static_cast<std::int32_t>(seen[static_cast<std::size_t>(i)] - waiting_for) >= 0) continue;
    on_timeout_(channel.first_rank + i);  // on record (or the process aborted) before the stream goes on
    // Every wait issued so far may pass: the communicator is failed now.
    SYMMPOOL_CU_TRY(drv_, cuStreamWriteValue32(reinterpret_cast<CUstream>(side),
                                               reinterpret_cast<CUdeviceptr>(channel.slots + i), issued,
                                               CU_STREAM_WRITE_VALUE_DEFAULT));
  }
  SYMMPOOL_CUDA_TRY(cudaStreamSynchronize(side));
}

}  // namespace symmpool::detail
