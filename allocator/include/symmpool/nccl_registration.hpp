#pragma once
// Registration hook: keeps every segment registered with one NCCL
// communicator (ncclCommRegister after map, ncclCommDeregister before unmap),
// so NCCL can use symmpool buffers zero-copy. Cached segments stay
// registered: in steady state no registration happens.

#include <symmpool/nccl_api.hpp>
#include <symmpool/segment.hpp>

#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>

namespace symmpool {

struct RegistrationCounts {
  std::uint64_t registrations = 0;    // ncclCommRegister calls that succeeded
  std::uint64_t deregistrations = 0;  // ncclCommDeregister calls
  std::uint64_t failed_deregistrations = 0;
  std::uint64_t abandoned = 0;  // left to an aborted communicator (abandon)
  std::size_t live = 0;         // segments registered now
  std::size_t live_bytes = 0;

  RegistrationCounts& operator+=(const RegistrationCounts& o) {
    registrations += o.registrations;
    deregistrations += o.deregistrations;
    failed_deregistrations += o.failed_deregistrations;
    abandoned += o.abandoned;
    live += o.live;
    live_bytes += o.live_bytes;
    return *this;
  }
};

class NcclRegistrationHook final : public SegmentObserver {
 public:
  // False once the communicator is aborted or failed, when someone else
  // may abort it (ProcessGroupNCCL's watchdog frees it without telling us).
  // Asked before every NCCL call; where it says false the hook abandons its
  // registrations (as abandon()) instead of calling into a freed
  // communicator. It cannot hold off an abort that starts right after it
  // answered: it narrows that window to the call itself.
  using UsableCheck = std::function<bool()>;

  explicit NcclRegistrationHook(ncclComm_t comm, const NcclApi& nccl = loaded_nccl(),
                                UsableCheck usable = {});
  ~NcclRegistrationHook() override;

  void on_segment_mapped(const Segment& segment) override;
  void on_segment_unmapping(const Segment& segment) noexcept override;

  ncclComm_t comm() const { return comm_; }
  RegistrationCounts counts() const;
  // Forgets every registration without deregistering, and registers nothing
  // from now on: for a communicator about to be aborted, which frees them
  // itself and may be stuck on a dead peer. Takes no allocator lock (a
  // thread may hold it waiting on that communicator's work); detach the hook
  // afterwards. Returns how many.
  std::size_t abandon() noexcept;

 private:
  struct Registration {
    void* handle;
    std::size_t size;
  };
  bool still_usable() const noexcept;  // under mutex_
  void abandon_locked() noexcept;      // under mutex_

  ncclComm_t comm_;
  const NcclApi& nccl_;
  UsableCheck usable_;
  mutable std::mutex mutex_;
  std::unordered_map<std::uint64_t, Registration> registrations_;  // by segment id
  RegistrationCounts counts_;
  bool abandoned_ = false;
};

}  // namespace symmpool
