#pragma once
// Gives the stream-memop waits the timeout the kernels' waits have.
// cuStreamWaitValue32 waits forever, so a dead peer would hang the stream
// (and cudaDeviceSynchronize, and the process's exit). This thread watches
// the waits by channel: the stream-op barriers (every rank's slot of our
// barrier row) and, per peer, the waits for that peer's signals (its slot of
// our signal row). When a channel has waits outstanding and none passed for
// `timeout`, it records each rank whose slot is behind through `on_timeout`
// (the communicator's failure monitor: the error goes on record first), then
// writes the awaited value into that slot so the stream goes on. Once the
// communicator failed for any reason, stalled waits go at once.

#include <symmpool/detail/peer_pointers.hpp>
#include <symmpool/driver_api.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace symmpool::detail {

class StreamOpWatchdog {
 public:
  // `barrier_row` and `signal_row`: our pad rows (device memory) the
  // barriers' and the signals' waits read, one slot per rank;
  // `error_flag`: host-mapped, nonzero once the communicator failed.
  StreamOpWatchdog(const DriverApi& drv, int device, std::uint32_t* barrier_row, std::uint32_t* signal_row,
                   int world, const int* error_flag, std::chrono::seconds timeout,
                   std::function<void(int)> on_timeout);
  ~StreamOpWatchdog();
  StreamOpWatchdog(const StreamOpWatchdog&) = delete;
  StreamOpWatchdog& operator=(const StreamOpWatchdog&) = delete;

  static constexpr int kBarrierChannel = 0;
  static constexpr int signal_channel(int peer) { return 1 + peer; }

  // After the waits of `channel` for `value` (a barrier's epoch, or a count
  // of the peer's signals) on `stream`: notes on the device that they passed.
  // Values on one channel are issued in increasing order, and its waits
  // pass in that order.
  void enqueue_passed(int channel, CUstream stream, std::uint32_t value);

 private:
  using Clock = std::chrono::steady_clock;
  struct Channel {
    std::uint32_t* slots = nullptr;  // device memory: the words its waits read
    int first_rank = 0;              // whose word slots[0] is
    int count = 0;
    std::atomic<std::uint32_t> issued{0};  // the value the last wait enqueued awaits
    std::uint32_t last_passed = 0;         // the thread's own: progress seen
    Clock::time_point since{};
  };
  static constexpr int kChannels = 1 + kMaxRanks;

  void watch();
  void release_stalled(Channel& channel, std::uint32_t passed, cudaStream_t side);

  const DriverApi& drv_;
  const int device_;
  const int* const error_flag_;
  const std::chrono::seconds timeout_;
  const std::function<void(int)> on_timeout_;
  std::array<Channel, kChannels> channels_;
  int channel_count_ = 0;
  std::uint32_t* passed_ = nullptr;   // host-mapped, one per channel: the last value that passed
  CUdeviceptr passed_on_device_ = 0;  // the same words, as the device sees them
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace symmpool::detail
