#include <symmpool/error.hpp>
#include <symmpool/log.hpp>
#include <symmpool/nccl_registration.hpp>

#include <cstdio>
#include <utility>

namespace symmpool {

NcclRegistrationHook::NcclRegistrationHook(ncclComm_t comm, const NcclApi& nccl, UsableCheck usable)
    : comm_(comm), nccl_(nccl), usable_(std::move(usable)) {
  SYMMPOOL_EXPECTS(comm != nullptr, "NCCL registration hook needs a communicator, got null");
}

NcclRegistrationHook::~NcclRegistrationHook() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!registrations_.empty())
    SYMMPOOL_WARN(kReg,
                  "NCCL registration hook destroyed with %zu segments still registered; detach it from the "
                  "allocator first",
                  registrations_.size());
}

void NcclRegistrationHook::on_segment_mapped(const Segment& segment) {
  // Held across the call, as on_segment_unmapping does: abandon() must not
  // clear the registrations while one is being made.
  std::lock_guard<std::mutex> lock(mutex_);
  if (abandoned_) return;  // its communicator is aborted or about to be
  if (!still_usable()) {
    abandon_locked();
    return;
  }
  void* handle = nullptr;
  SYMMPOOL_NCCL_TRY(nccl_, commRegister(comm_, segment.ptr(), segment.size, &handle));
  registrations_[segment.id] = {handle, segment.size};
  ++counts_.registrations;
  ++counts_.live;
  counts_.live_bytes += segment.size;
}

void NcclRegistrationHook::on_segment_unmapping(const Segment& segment) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = registrations_.find(segment.id);
  if (it == registrations_.end()) return;
  if (!still_usable()) {
    abandon_locked();  // NCCL freed them with the communicator
    return;
  }
  ncclResult_t r = nccl_.commDeregister(comm_, it->second.handle);
  ++counts_.deregistrations;
  if (r != ncclSuccess) {
    ++counts_.failed_deregistrations;
    SYMMPOOL_WARN(kReg, "ncclCommDeregister of segment %llu failed: %s",
                  static_cast<unsigned long long>(segment.id), nccl_.error_string(r));
  }
  --counts_.live;
  counts_.live_bytes -= it->second.size;
  registrations_.erase(it);
}

std::size_t NcclRegistrationHook::abandon() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::size_t n = registrations_.size();
  abandon_locked();
  return n;
}

void NcclRegistrationHook::abandon_locked() noexcept {
  abandoned_ = true;
  counts_.abandoned += registrations_.size();
  registrations_.clear();
  counts_.live = 0;
  counts_.live_bytes = 0;
}

bool NcclRegistrationHook::still_usable() const noexcept {
  if (!usable_) return true;
  try {
    return usable_();
  } catch (...) {
    return false;  // a check that cannot tell: do not call into the communicator
  }
}

RegistrationCounts NcclRegistrationHook::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

}  // namespace symmpool
