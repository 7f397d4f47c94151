#include "caching_allocator_block.hpp"

#include <symmpool/caching_allocator.hpp>
#include <symmpool/detail/checked_size.hpp>
#include <symmpool/detail/format.hpp>
#include <symmpool/error.hpp>
#include <symmpool/log.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>

namespace symmpool {

using detail::format_bytes;
using detail::format_pointer;

bool CachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream)
    return reinterpret_cast<std::uintptr_t>(a->stream) < reinterpret_cast<std::uintptr_t>(b->stream);
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

namespace {

std::size_t round_size(std::size_t bytes) {
  return detail::round_up_checked(bytes, CachingAllocator::kMinBlockSize, "allocation");
}

std::size_t segment_size_for(std::size_t size) {
  if (size <= CachingAllocator::kSmallSize) return CachingAllocator::kSmallSegment;
  if (size < CachingAllocator::kMinLargeAlloc) return CachingAllocator::kLargeSegment;
  return detail::round_up_checked(size, CachingAllocator::kLargeRounding, "allocation");
}

// Event queries, event records and segment (un)mapping are host work with
// no implicit sync: this thread relaxes its capture mode around them, as the
// collectives do for their host work. In the default global mode a graph
// captured on any stream would refuse them and be invalidated (PyTorch's
// allocator skips its event queries during captures instead). Only around
// them: a cache hit with no event to look at makes no driver call at all
// (the mode's exchange was most of its time).
class RelaxedCapture {
 public:
  explicit RelaxedCapture(const DriverApi& drv) : drv_(drv) {
    drv_.cuThreadExchangeStreamCaptureMode(&previous_);
  }
  ~RelaxedCapture() { drv_.cuThreadExchangeStreamCaptureMode(&previous_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  const DriverApi& drv_;
  CUstreamCaptureMode previous_ = CU_STREAM_CAPTURE_MODE_RELAXED;
};

}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<SegmentArena> arena, bool move_idle_segments)
    : drv_(arena->driver()), arena_(std::move(arena)), move_idle_segments_(move_idle_segments) {
  device_total_ = arena_->device_memory_info().second;
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!active_.empty()) {
    std::size_t bytes = 0;
    for (auto& [ptr, block] : active_) bytes += block->size;
    SYMMPOOL_WARN(kAlloc, "allocator of device %d destroyed with %zu live allocations (%s)", device(),
                  active_.size(), format_bytes(bytes).c_str());
  }
  try {
    synchronize_events();
  } catch (const std::exception& e) {
    SYMMPOOL_WARN(kAlloc, "%s", e.what());
  }
  // Events still pending (synchronizing failed) go too: the segments are unmapped below.
  for (auto& [event, block] : pending_) drv_.cuEventDestroy(event);
  for (auto& retiring : retiring_) drv_.cuEventDestroy(retiring.event);
  for (CUevent e : spare_events_) drv_.cuEventDestroy(e);
  for (auto& [id, head] : segment_heads_) {
    for (Block* b = head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
  for (Block* b : spare_blocks_) delete b;
  // arena_ unmaps the segments (telling observers) when it is destroyed.
}

CachingAllocator::Pool& CachingAllocator::pool_of(const Block* block) {
  return pool_for(block->owner, block->small);
}

CachingAllocator::Pool& CachingAllocator::pool_for(PrivatePool* owner, bool small) {
  if (owner != nullptr) return small ? owner->small : owner->large;
  return small ? small_pool_ : large_pool_;
}

void* CachingAllocator::allocate(std::size_t bytes, CUstream stream) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  SYMMPOOL_EXPECTS(bytes <= device_total_, "cannot allocate " + format_bytes(bytes) + ": more than device " +
                                               std::to_string(device()) + "'s total memory of " +
                                               format_bytes(device_total_));
  std::optional<RelaxedCapture> relaxed;
  if (!pending_.empty() || !unrecorded_.empty() || !retiring_.empty()) {
    relaxed.emplace(drv_);
    process_events();
  }

  const std::size_t size = round_size(bytes);
  const bool small = size <= kSmallSize;
  PrivatePool* owner = routing_to_private_pool() ? route(stream) : nullptr;
  Pool& pool = pool_for(owner, small);

  Block* block = find_free_block(pool, stream, size);
  if (block != nullptr) {
    ++stats_.cache_hits;
    pool_erase(pool, block);
  } else {
    ++stats_.cache_misses;
    if (!relaxed) relaxed.emplace(drv_);
    block = new_segment_block(size, bytes, stream, small, owner);
  }
  block = split(block, size, pool);
  make_live(block, bytes);
  return reinterpret_cast<void*>(block->ptr);
}

void CachingAllocator::make_live(Block* block, std::size_t requested) {
  block->allocated = true;
  block->requested = requested;
  block->serial = ++serials_;
  add_active(block);
  ++stats_.allocations;
  stats_.add_blocks(block->small, 1, static_cast<std::int64_t>(block->size),
                    static_cast<std::int64_t>(requested));
  stats_.add_busy(block->small, 1, static_cast<std::int64_t>(block->size));
}

CachingAllocator::Block* CachingAllocator::find_free_block(Pool& pool, CUstream stream, std::size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  return *it;
}

CachingAllocator::Block* CachingAllocator::new_segment_block(std::size_t size, std::size_t requested,
                                                             CUstream stream, bool small,
                                                             PrivatePool* owner) {
  const std::size_t want = segment_size_for(size);
  ContextGuard guard(drv_, arena_->context());
  if (!small) {
    retire_outgrown_segments(stream);
    if (move_idle_segments_ && owner == nullptr)
      if (Block* idle = take_idle_segment_of_another_stream(size, stream)) return idle;
  }
  const Segment* segment = arena_->map_new_segment(want);
  if (segment == nullptr) {
    // Give every cached segment back and try once more, as PyTorch does.
    ++stats_.oom_retries;
    try_retry_unrecorded_events();  // a failure was reported by the free; not an allocation error
    synchronize_pending_events();
    try {
      release_cached_segments();
    } catch (const std::exception& e) {
      // What did go back may be enough: the map below decides.
      SYMMPOOL_WARN(kAlloc, "releasing cached segments for an allocation failed: %s", e.what());
    }
    segment = arena_->map_new_segment(want);
  }
  if (segment == nullptr) {
    ++stats_.ooms;
    auto [free_bytes, total_bytes] = arena_->device_memory_info();
    throw out_of_memory(
        "symmpool: out of memory on device " + std::to_string(device()) + ": tried to allocate " +
        format_bytes(requested) + " (a new segment of " + format_bytes(want) + "); symmpool has " +
        format_bytes(static_cast<std::size_t>(stats_.reserved_bytes.current)) + " reserved, of which " +
        format_bytes(static_cast<std::size_t>(stats_.allocated_bytes.current)) +
        " allocated, and its largest free cached block is " + format_bytes(largest_free_block_locked()) +
        "; the device has " + format_bytes(free_bytes) + " free of " + format_bytes(total_bytes));
  }
  auto* block = new Block;
  block->ptr = segment->address;
  block->size = segment->size;
  block->stream = stream;
  block->segment = segment;
  block->small = small;
  block->owner = owner;
  if (owner != nullptr) ++owner->segments;
  segment_heads_.emplace(segment->id, block);
  ++stats_.segment_maps;
  stats_.add_segments(small ? &stats_.small_pool : &stats_.large_pool, 1,
                      static_cast<std::int64_t>(segment->size));
  return block;
}

CachingAllocator::Block* CachingAllocator::split(Block* block, std::size_t size, Pool& pool) {
  const std::size_t remaining = block->size - size;
  const bool worth_it = block->small ? remaining >= kMinBlockSize : remaining > kSmallSize;
  return worth_it ? split_at(block, size, pool) : block;
}

CachingAllocator::Block* CachingAllocator::split_at(Block* block, std::size_t size, Pool& pool) {
  if (size == block->size) return block;
  Block* rest = make_block();
  rest->ptr = block->ptr + size;
  rest->size = block->size - size;
  rest->stream = block->stream;
  rest->segment = block->segment;
  rest->small = block->small;
  rest->owner = block->owner;
  rest->prev = block;
  rest->next = block->next;
  if (rest->next) rest->next->prev = rest;
  block->next = rest;
  block->size = size;
  pool_insert(pool, rest);
  return block;
}

void CachingAllocator::deallocate(void* ptr, CUstream stream) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  release(take_active(ptr), stream);
}

void CachingAllocator::deallocate(void* ptr, std::size_t bytes, CUstream stream) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = active_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == active_.end()) throw_unknown_pointer(ptr, "free");
  SYMMPOOL_EXPECTS(it->second->requested == bytes,
                   "free of " + format_pointer(ptr) + " with size " + std::to_string(bytes) +
                       ", but it was allocated with size " + std::to_string(it->second->requested));
  release(take_active(it), stream);
}

void CachingAllocator::deallocate_in_stream_order(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = take_active(ptr);
  release(block, block->stream);
}

CachingAllocator::Block* CachingAllocator::take_active(void* ptr) {
  auto it = active_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == active_.end()) throw_unknown_pointer(ptr, "free");
  return take_active(it);
}

void CachingAllocator::release(Block* block, CUstream stream) {
  ++stats_.frees;
  stats_.add_blocks(block->small, -1, static_cast<std::int64_t>(block->size),
                    static_cast<std::int64_t>(block->requested));
  block->allocated = false;
  block->requested = 0;

  // Freed on another stream than its own: that stream's work must finish first.
  if (stream != block->stream &&
      std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) == block->stream_uses.end())
    block->stream_uses.push_back(stream);

  if (block->stream_uses.empty()) {
    free_at_last(block);
    return;
  }
  // While a capture may be under way the events wait for its end (an event
  // recorded on a capturing stream orders nothing outside the graph).
  if (routing_to_private_pool()) {
    unrecorded_.push_back(block);
    return;
  }
  // The free itself is done; if an event cannot be recorded the block waits
  // out of the pool for a retry, and the caller hears of the failure.
  try {
    RelaxedCapture relaxed(drv_);
    record_events(block);
  } catch (...) {
    unrecorded_.push_back(block);
    throw;
  }
}

void CachingAllocator::free_at_last(Block* block) {
  stats_.add_busy(block->small, -1, static_cast<std::int64_t>(block->size));
  free_block(block);
}

void CachingAllocator::free_block(Block* block) {
  Pool& pool = pool_of(block);
  if (Block* prev = block->prev; prev && prev->is_free()) {
    pool_erase(pool, prev);
    prev->size += block->size;
    prev->next = block->next;
    if (prev->next) prev->next->prev = prev;
    drop_block(block);
    block = prev;
  }
  if (Block* next = block->next; next && next->is_free()) {
    pool_erase(pool, next);
    block->size += next->size;
    block->next = next->next;
    if (block->next) block->next->prev = block;
    drop_block(next);
  }
  pool_insert(pool, block);
}

void CachingAllocator::record_stream(void* ptr, CUstream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = active_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == active_.end()) throw_unknown_pointer(ptr, "record_stream on");
  Block* block = it->second;
  if (stream == block->stream) return;
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) == block->stream_uses.end())
    block->stream_uses.push_back(stream);
}

void* CachingAllocator::map_internal_segment(int slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  ContextGuard guard(drv_, arena_->context());
  const Segment* segment = arena_->map_internal_segment(slot);
  if (segment == nullptr)
    throw out_of_memory("symmpool: out of memory on device " + std::to_string(device()) +
                        " for an internal segment of " + format_bytes(arena_->granularity()));
  stats_.add_segments(nullptr, 1, static_cast<std::int64_t>(segment->size));
  return segment->ptr();
}

void CachingAllocator::unmap_internal_segment(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Segment* segment = arena_->find(reinterpret_cast<std::uintptr_t>(ptr));
  SYMMPOOL_EXPECTS(
      segment != nullptr && arena_->is_internal(*segment) && segment->ptr() == ptr,
      detail::format_pointer(ptr) + " is not an internal segment of device " + std::to_string(device()));
  ContextGuard guard(drv_, arena_->context());
  stats_.add_segments(nullptr, -1, static_cast<std::int64_t>(segment->size));
  arena_->unmap_segment(segment);
}

std::uint64_t CachingAllocator::free_internal_slots() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return arena_->free_internal_slots();
}

std::size_t CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  synchronize_events();
  return release_cached_segments();
}

}  // namespace symmpool
