#pragma once
// Gives stream-memop barriers the timeout the barrier kernel has.
// cuStreamWaitValue32 waits forever, so a dead peer would hang the stream
// (and cudaDeviceSynchronize, and the process's exit). This thread watches
// the barriers: when some were issued, none passed for `timeout`, it records
// the first missing peer through `on_timeout` (the communicator's failure
// monitor: the error goes on record first), then writes the awaited epoch
// into the missing peers' slots of our pad row so the stream goes on. Once
// the communicator failed for any reason, stalled barriers go at once.

#include <symmpool/driver_api.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

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
  // `row`: our pad slots of stream-op barriers, one per rank (device memory);
  // `error_flag`: host-mapped, nonzero once the communicator failed.
  StreamOpWatchdog(const DriverApi& drv, int device, std::uint32_t* row, int world, const int* error_flag,
                   std::chrono::seconds timeout, std::function<void(int)> on_timeout);
  ~StreamOpWatchdog();
  StreamOpWatchdog(const StreamOpWatchdog&) = delete;
  StreamOpWatchdog& operator=(const StreamOpWatchdog&) = delete;

  // After the barrier `epoch`'s waits on `stream`: notes on the device that it passed.
  void enqueue_passed(CUstream stream, std::uint32_t epoch);

 private:
  void watch();
  void release_stalled_barriers(cudaStream_t side);

  const DriverApi& drv_;
  const int device_;
  std::uint32_t* const row_;
  const int world_;
  const int* const error_flag_;
  const std::chrono::seconds timeout_;
  const std::function<void(int)> on_timeout_;
  std::uint32_t* passed_ = nullptr;   // host-mapped: the last barrier that passed
  CUdeviceptr passed_on_device_ = 0;  // the same word, as the device sees it
  std::atomic<std::uint32_t> issued_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace symmpool::detail
