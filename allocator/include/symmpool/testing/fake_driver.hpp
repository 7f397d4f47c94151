#pragma once
// A fake CUDA driver for tests without a GPU. "Device memory" is host memory:
// each cuMemCreate handle is a memfd, mapped into reserved host address space
// by cuMemMap, so buffers can be written and read. Every call is logged;
// failures can be injected; events can be held pending to test stream order.

#include <symmpool/driver_api.hpp>
#include <symmpool/nccl_api.hpp>

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace symmpool::testing {

struct FakeDeviceConfig {
  std::size_t total_memory = std::size_t{1} << 30;
  std::size_t granularity = std::size_t{2} << 20;
  std::size_t multicast_granularity = std::size_t{4} << 20;
  bool multicast_supported = false;
  bool fabric_supported = false;
};

class FakeDriver {
 public:
  // The process-wide fake; reset() before each test.
  static FakeDriver& instance();

  void reset(int device_count = 2, FakeDeviceConfig config = {});
  const DriverApi& api() const;
  // Fake ncclCommRegister/Deregister and ncclCommWindowRegister/Deregister,
  // logged here too.
  const NcclApi& nccl() const;

  // The next `count` calls of `function` after `skip` more calls fail with `code`.
  void fail(const std::string& function, int code, int count = 1, int skip = 0);

  std::vector<std::string> calls() const;
  std::size_t count(const std::string& function) const;
  std::size_t count_prefix(const std::string& prefix) const;
  void clear_calls();

  // While held, recorded events stay pending until complete_events() or a
  // cuEventSynchronize on them.
  void hold_events(bool hold);
  void complete_events();
  // As ncclCommAbort does: every registration goes with its communicator.
  void abort_nccl_communicators();
  // Every cuStreamWaitEvent so far: (the waiting stream, the stream its
  // event was last recorded on).
  std::vector<std::pair<CUstream, CUstream>> stream_waits() const;
  // A capturing stream reports CU_STREAM_CAPTURE_STATUS_ACTIVE.
  void set_capturing(CUstream stream, bool capturing);
  // Runs `meanwhile` inside every cuCtxSynchronize (empty: none), as other
  // threads run while a real device drains.
  void on_context_synchronize(std::function<void()> meanwhile);
  // Runs `meanwhile` inside every ncclCommWindowRegister, where NCCL's
  // bootstrap barrier waits for the peers (empty: none).
  void on_window_register(std::function<void()> meanwhile);

  std::size_t used_memory(int device) const;  // bytes in live handles
  std::size_t live_handles() const;
  std::size_t live_mappings() const;
  std::size_t live_reservations() const;
  std::size_t live_events() const;
  std::size_t live_nccl_registrations() const;
  std::size_t live_nccl_windows() const;
};

}  // namespace symmpool::testing
