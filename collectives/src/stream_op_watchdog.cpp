#include "stream_op_watchdog.hpp"

#include <symmpool/error.hpp>

#include <cstdio>
#include <exception>
#include <vector>

namespace symmpool::detail {

StreamOpWatchdog::StreamOpWatchdog(const DriverApi& drv, int device, std::uint32_t* row, int world,
                                   const int* error_flag, std::chrono::seconds timeout,
                                   std::function<void(int)> on_timeout)
    : drv_(drv),
      device_(device),
      row_(row),
      world_(world),
      error_flag_(error_flag),
      timeout_(timeout),
      on_timeout_(std::move(on_timeout)) {
  SYMMPOOL_CUDA_TRY(
      cudaHostAlloc(reinterpret_cast<void**>(&passed_), sizeof(std::uint32_t), cudaHostAllocMapped));
  *passed_ = 0;
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

void StreamOpWatchdog::enqueue_passed(CUstream stream, std::uint32_t epoch) {
  issued_.store(epoch);
  SYMMPOOL_CU_TRY(drv_,
                  cuStreamWriteValue32(stream, passed_on_device_, epoch, CU_STREAM_WRITE_VALUE_DEFAULT));
}

void StreamOpWatchdog::watch() {
  using clock = std::chrono::steady_clock;
  cudaStream_t side = nullptr;
  try {
    SYMMPOOL_CUDA_TRY(cudaSetDevice(device_));
    SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    std::uint32_t last_passed = 0;
    auto since = clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stop_; })) {
      const std::uint32_t passed = *static_cast<volatile std::uint32_t*>(passed_);
      const bool failed = *static_cast<const volatile int*>(error_flag_) != 0;
      if (passed == issued_.load() || (passed != last_passed && !failed)) {  // idle, or moving
        last_passed = passed;
        since = clock::now();
      } else if (failed || clock::now() - since >= timeout_) {
        release_stalled_barriers(side);
        since = clock::now();
      }
    }
  } catch (const std::exception& e) {
    // No caller to throw to: say why stream-op barriers lost their timeout.
    std::fprintf(stderr, "symmpool: stream-op barrier watchdog stopped: %s\n", e.what());
  }
  if (side) cudaStreamDestroy(side);
}

void StreamOpWatchdog::release_stalled_barriers(cudaStream_t side) {
  const std::uint32_t waiting_for = *static_cast<volatile std::uint32_t*>(passed_) + 1;
  const std::uint32_t issued = issued_.load();
  std::vector<std::uint32_t> seen(static_cast<std::size_t>(world_));
  SYMMPOOL_CUDA_TRY(
      cudaMemcpyAsync(seen.data(), row_, seen.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost, side));
  SYMMPOOL_CUDA_TRY(cudaStreamSynchronize(side));
  for (int p = 0; p < world_; ++p) {
    if (static_cast<std::int32_t>(seen[static_cast<std::size_t>(p)] - waiting_for) >= 0) continue;
    on_timeout_(p);  // on record (or the process aborted) before the stream goes on
    // Every barrier issued so far may pass: the communicator is failed now.
    SYMMPOOL_CU_TRY(
        drv_, cuStreamWriteValue32(reinterpret_cast<CUstream>(side), reinterpret_cast<CUdeviceptr>(row_ + p),
                                   issued, CU_STREAM_WRITE_VALUE_DEFAULT));
  }
  SYMMPOOL_CUDA_TRY(cudaStreamSynchronize(side));
}

}  // namespace symmpool::detail
