#include <symmpool/detail/format.hpp>
#include <symmpool/error.hpp>
#include <symmpool/rendezvous_registry.hpp>

#include <algorithm>
#include <iterator>

namespace symmpool {

bool RendezvousRegistry::still_allocated(std::uintptr_t start, const Range& range) const {
  const auto live = allocator_.live_allocation(reinterpret_cast<const void*>(start), range.bytes);
  return live && live->serial == range.serial;
}

void RendezvousRegistry::add(const void* ptr, std::size_t bytes) {
  const auto live = allocator_.live_allocation(ptr, bytes);
  SYMMPOOL_EXPECTS(live.has_value(), "rendezvous of " + std::to_string(bytes) + " bytes at " +
                                         detail::format_pointer(ptr) +
                                         ": not inside one live symmpool allocation");
  std::lock_guard<std::mutex> lock(mutex_);
  // Pruned here, on the rare collective call, not on every peer lookup.
  for (auto it = ranges_.begin(); it != ranges_.end();)
    it = still_allocated(it->first, it->second) ? std::next(it) : ranges_.erase(it);
  Range& range = ranges_[reinterpret_cast<std::uintptr_t>(ptr)];
  if (range.serial != live->serial) range = Range{};
  range.bytes = std::max(range.bytes, bytes);
  range.serial = live->serial;
}

std::string RendezvousRegistry::why_not_covered(const void* ptr, std::size_t bytes) const {
  const auto start = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  bool freed = false;
  const auto past_start = ranges_.upper_bound(start);  // ranges that begin at or before `ptr`
  for (auto it = ranges_.begin(); it != past_start; ++it) {
    if (it->first + it->second.bytes < start + bytes) continue;
    if (still_allocated(it->first, it->second)) return {};
    freed = true;
  }
  const std::string what = std::to_string(bytes) + " bytes at " + detail::format_pointer(ptr);
  return freed ? what +
                     " were rendezvoused, but their buffer was freed since; rendezvous the new one on every "
                     "rank"
               : what + " were not rendezvoused; call rendezvous on their buffer on every rank first";
}

std::size_t RendezvousRegistry::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ranges_.size();
}

}  // namespace symmpool
