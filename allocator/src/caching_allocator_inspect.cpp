// CachingAllocator's queries: who owns a pointer, live allocations,
// statistics, observers, segments and snapshots.

#include "caching_allocator_block.hpp"

#include <symmpool/detail/format.hpp>
#include <symmpool/error.hpp>

#include <algorithm>
#include <string>

namespace symmpool {

using detail::format_pointer;

bool CachingAllocator::owns(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return arena_->find(reinterpret_cast<std::uintptr_t>(ptr)) != nullptr;
}

bool CachingAllocator::is_allocation(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return active_.count(reinterpret_cast<std::uintptr_t>(ptr)) != 0;
}

std::size_t CachingAllocator::allocation_size(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = active_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == active_.end()) throw_unknown_pointer(ptr, "size of");
  return it->second->requested;
}

std::optional<LiveAllocation> CachingAllocator::live_allocation(const void* ptr, std::size_t bytes) const {
  const auto first = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  const Segment* segment = arena_->find(first);
  if (segment == nullptr) return std::nullopt;
  for (const Block* b = segment_heads_.at(segment->id); b != nullptr; b = b->next) {
    if (first < b->ptr || first >= b->ptr + b->size) continue;
    if (!b->allocated || first + bytes > b->ptr + b->requested) return std::nullopt;
    return LiveAllocation{b->ptr, b->requested, b->serial};
  }
  return std::nullopt;
}

void CachingAllocator::throw_unknown_pointer(const void* ptr, const char* action) const {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  const std::string where = " on device " + std::to_string(device());
  const Segment* segment = arena_->find(address);
  if (segment == nullptr)
    SYMMPOOL_FAIL(std::string(action) + " " + format_pointer(ptr) +
                  ": pointer was not allocated by symmpool" + where);
  for (Block* b = segment_heads_.at(segment->id); b != nullptr; b = b->next) {
    if (b->ptr == address && !b->allocated)
      SYMMPOOL_FAIL(std::string(action) + " " + format_pointer(ptr) +
                    ": pointer was already freed (double free?)" + where);
  }
  SYMMPOOL_FAIL(std::string(action) + " " + format_pointer(ptr) +
                ": pointer lies inside a symmpool segment but is not the start of an allocation" + where);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.reset_peaks();
}

void CachingAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.reset_accumulated();
}

void CachingAllocator::add_observer(SegmentObserver* observer, bool replay_existing) {
  std::lock_guard<std::mutex> lock(mutex_);
  arena_->add_observer(observer, replay_existing);
}

void CachingAllocator::remove_observer(SegmentObserver* observer, bool replay_existing) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  arena_->remove_observer(observer, replay_existing);
}

std::vector<Segment> CachingAllocator::segments() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Segment> out;
  for (const Segment* s : arena_->segments()) out.push_back(*s);
  return out;
}

std::vector<SegmentSnapshot> CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<SegmentSnapshot> out;
  out.reserve(segment_heads_.size());
  for (const auto& [id, head] : segment_heads_) {
    SegmentSnapshot segment{head->segment->address,
                            head->segment->size,
                            head->stream,
                            head->small,
                            head->owner ? head->owner->id : kDefaultPool,
                            {}};
    for (const Block* b = head; b != nullptr; b = b->next)
      segment.blocks.push_back({b->ptr, b->size, b->requested, b->allocated, !b->allocated && !b->is_free()});
    out.push_back(std::move(segment));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
  return out;
}

std::size_t CachingAllocator::largest_free_block() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return largest_free_block_locked();
}

std::size_t CachingAllocator::largest_free_block_locked() const {
  std::size_t largest = 0;
  for (const Pool* pool : {&small_pool_, &large_pool_})
    for (const Block* b : *pool) largest = std::max(largest, b->size);
  return largest;
}

}  // namespace symmpool
