#pragma once
// Events for the ends of collectives, recorded once per eager call and
// shared (SharedEvent) by the issue order, the flight record and the caller's
// Work: one cudaEventRecord per call where each kept its own. Once a kernel
// is queued a record costs more than on an idle stream, and more again with
// many calls queued: a launch then three records and a wait took longer than
// a launch then one record
// (bench/results/cuda_call_cost_h100x1_2026-11-24.json). Events are reused
// once nobody holds them, so none is created or destroyed per call.

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
