#pragma once
// First-fit allocator of sub-ranges inside one reserved virtual range.
// Lowest address first, so the same sequence of requests gives the same
// offsets in every process (SPMD ranks get symmetric offsets).

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

namespace symmpool::detail {

class RangeAllocator {
 public:
  explicit RangeAllocator(std::size_t capacity) { free_[0] = capacity; }

  // Offset of a free range of `size` bytes, or nullopt when none is large enough.
  std::optional<std::size_t> allocate(std::size_t size) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < size) continue;
      std::size_t offset = it->first;
      std::size_t rest = it->second - size;
      free_.erase(it);
      if (rest > 0) free_[offset + size] = rest;
      return offset;
    }
    return std::nullopt;
  }

  // Returns [offset, offset + size) and merges it with free neighbours.
  void release(std::size_t offset, std::size_t size) {
    auto next = free_.lower_bound(offset);
    if (next != free_.end() && offset + size == next->first) {
      size += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        prev->second += size;
        return;
      }
    }
    free_[offset] = size;
  }

  std::size_t free_range_count() const { return free_.size(); }

 private:
  std::map<std::size_t, std::size_t> free_;  // offset -> size, never adjacent
};

}  // namespace symmpool::detail
