#pragma once
// Events for the ends of collectives, recorded once per eager call and
// shared (SharedEvent) by the issue order, the flight record and the caller's
// Work: one cudaEventRecord per call where each kept its own. Once a kernel
// is queued, every record costs: on an H100 host a launch then three records
// and a wait took 7.8 us, a launch then one record 3.6 us
// (bench/cuda_call_cost_bench.cu). Events are reused once nobody holds them,
// so none is created or destroyed per call.

#include <symmpool/detail/shared_event.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace symmpool::detail {

class EventPool : public std::enable_shared_from_this<EventPool> {
 public:
  // Handles keep the pool alive: a Work may outlive its communicator.
  static std::shared_ptr<EventPool> make() { return std::shared_ptr<EventPool>(new EventPool()); }
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // An event recorded on `stream` now (`stream`'s device must be the current one).
  SharedEvent record(cudaStream_t stream);
  // Events waiting for reuse (for tests).
  std::size_t spare() const;

 private:
  EventPool() = default;
  cudaEvent_t take();
  void give_back(cudaEvent_t event) noexcept;  // from any thread

  mutable std::mutex mutex_;
  std::vector<cudaEvent_t> spare_;
};

}  // namespace symmpool::detail
