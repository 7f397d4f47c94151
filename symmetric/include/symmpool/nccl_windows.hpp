#pragma once
// NCCL's symmetric windows over a heap's symmetric segments. Since NCCL 2.27,
// memory registered with ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC)
// lets NCCL run its symmetric kernels, which read a peer's buffer at this
// rank's offset in the window. So only segments at the same offset and size
// on every rank become windows, in the same order on every rank (NCCL places
// each window in its own address space by that order), at the heap's
// collective points (never inside an allocation or under the allocator's
// locks: registration ends in a barrier of NCCL's that has no timeout, so
// each one runs on a thread of its own and is waited for up to a deadline).
// A window exists on every rank or on none: a segment NCCL refuses on any
// rank stays registered locally only (NcclRegistrationHook), counted and
// reported. Windows go before their memory does (release_cached) and with
// this object; an aborted communicator keeps them (abandon), as NCCL frees
// them itself.

#include <symmpool/nccl_api.hpp>
#include <symmpool/symmetric_heap.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace symmpool {

struct WindowCounts {
  std::uint64_t registrations = 0;  // windows every rank registered
  std::uint64_t deregistrations = 0;
  std::uint64_t failed_deregistrations = 0;
  std::uint64_t refusals = 0;  // segments NCCL refused on some rank (they stay registered locally)
  std::uint64_t abandoned = 0;
  std::size_t live = 0;  // windows now
  std::size_t live_bytes = 0;
  // Time this rank spent in ncclCommWindowRegister (NCCL's barrier with its
  // peers included), and in the longest one.
  std::uint64_t register_ns = 0;
  std::uint64_t longest_register_ns = 0;

  WindowCounts& operator+=(const WindowCounts& o) {
    registrations += o.registrations;
    deregistrations += o.deregistrations;
    failed_deregistrations += o.failed_deregistrations;
    refusals += o.refusals;
    abandoned += o.abandoned;
    live += o.live;
    live_bytes += o.live_bytes;
    register_ns += o.register_ns;
    longest_register_ns = std::max(longest_register_ns, o.longest_register_ns);
    return *this;
  }
};

class NcclWindows final : public SymmetricSegmentObserver {
 public:
  // As NcclRegistrationHook's: false once someone else may abort the
  // communicator; then nothing more is called on it.
  using UsableCheck = std::function<bool()>;

  // Collective over the heap's ranks, whose NCCL communicator `comm` is (the
  // same ranks in the same order): attaches to `heap` and makes the segments
  // symmetric now windows. `timeout` bounds each registration and each
  // exchange: a rank that does not arrive fails every rank (timeout_error
  // naming it), and the heap with it. Throws logic_error where the loaded
  // NCCL has no windows.
  NcclWindows(SymmetricHeap& heap, ncclComm_t comm, const NcclApi& nccl, std::chrono::milliseconds timeout,
              UsableCheck usable = {});
  // Detaches and deregisters every window left (local in NCCL): the device
  // must have finished the work that uses them.
  ~NcclWindows() override;
  NcclWindows(const NcclWindows&) = delete;
  NcclWindows& operator=(const NcclWindows&) = delete;

  // Whether [ptr, ptr + bytes) lies in one window of this rank.
  bool covers(const void* ptr, std::size_t bytes) const;
  // Whether there is no window: the same on every rank between collective points.
  bool empty() const;
  WindowCounts counts() const;
  // The last refusal, as reported: "" when none.
  std::string last_refusal() const;
  // Forgets every window without deregistering and registers nothing from
  // now on (an aborted communicator frees them). Returns how many.
  std::size_t abandon() noexcept;

  void on_symmetric_segments(const std::vector<SymmetricSegment>& now) override;
  void on_segments_releasing() override;

 private:
  struct Window {
    ncclWindow_t handle;
    std::size_t offset;
    std::size_t size;
  };
  // What one rank's registration of a segment came to.
  enum class Outcome { kRegistered, kRefused, kStuck };
  // ncclCommWindowRegister of `segment`, waited for up to the timeout.
  Outcome register_window(const SymmetricSegment& segment, ncclWindow_t* window, std::string* why);
  void deregister(const Window& window) noexcept;  // under mutex_
  void deregister_all() noexcept;
  bool still_usable() noexcept;  // under mutex_; abandons where not

  SymmetricHeap& heap_;
  ncclComm_t comm_;
  const NcclApi& nccl_;
  std::chrono::milliseconds timeout_;
  UsableCheck usable_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, Window> windows_;  // by address
  WindowCounts counts_;
  std::string last_refusal_;
  bool abandoned_ = false;
};

// Windows every NcclWindows of this process holds now (none deregistered or
// abandoned since): what a test reads once a group is gone.
std::size_t nccl_windows_in_process();

}  // namespace symmpool
