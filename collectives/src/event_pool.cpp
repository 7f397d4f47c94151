#include "event_pool.hpp"

#include <symmpool/driver_api.hpp>
#include <symmpool/error.hpp>

namespace symmpool::detail {

EventPool::~EventPool() {
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
}

cudaEvent_t EventPool::take() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!spare_.empty()) {
      cudaEvent_t e = spare_.back();
      spare_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  SYMMPOOL_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void EventPool::give_back(cudaEvent_t event) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    spare_.push_back(event);
  } catch (...) {
    cudaEventDestroy(event);  // no room to keep it
  }
}

SharedEvent EventPool::record(cudaStream_t stream) {
  cudaEvent_t e = take();
  // The driver's call: the runtime's wrapper adds host time to every eager
  // call (docs/DESIGN.md, "Life of one collective";
  // bench/results/host_time_h200x2_2026-11-27_host-path-through-driver-ab.json).
  const DriverApi& drv = real_driver();
  const CUresult status = drv.cuEventRecord(reinterpret_cast<CUevent>(e), reinterpret_cast<CUstream>(stream));
  if (status != CUDA_SUCCESS) {
    give_back(e);
    detail::throw_cuda_error(__FILE__, __LINE__, "cuEventRecord", status, drv.error_string(status));
  }
  // The deleter runs even when making the handle throws.
  return SharedEvent(e, [pool = shared_from_this()](cudaEvent_t done) { pool->give_back(done); });
}

std::size_t EventPool::spare() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return spare_.size();
}

}  // namespace symmpool::detail
