#pragma once
// The ranges of a heap that went through rendezvous, each tied to the
// allocation that held it then: once that allocation is freed, its range no
// longer counts, even if a new buffer lands at the same address (the peers'
// bytes there may now belong to something else). Thread-safe.

#include <symmpool/caching_allocator.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace symmpool {

class RendezvousRegistry {
 public:
  explicit RendezvousRegistry(const CachingAllocator& allocator) : allocator_(allocator) {}

  // Remembers [ptr, ptr + bytes), which must lie in one live allocation
  // (logic_error otherwise), and forgets ranges whose allocation is gone.
  void add(const void* ptr, std::size_t bytes);

  // "" when [ptr, ptr + bytes) lies in a remembered range whose allocation
  // still lives, otherwise why not, for an error message.
  std::string why_not_covered(const void* ptr, std::size_t bytes) const;

  std::size_t size() const;  // ranges remembered (live or not yet pruned)

 private:
  struct Range {
    std::size_t bytes = 0;
    std::uint64_t serial = 0;  // of the allocation that held it
  };
  bool still_allocated(std::uintptr_t start, const Range& range) const;

  const CachingAllocator& allocator_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, Range> ranges_;  // by start address
};

}  // namespace symmpool
