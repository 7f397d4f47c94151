#include <symmpool/caching_allocator.hpp>
#include <symmpool/detail/checked_size.hpp>
#include <symmpool/detail/format.hpp>
#include <symmpool/error.hpp>
#include <symmpool/log.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

namespace symmpool {

using detail::format_bytes;
using detail::format_pointer;

struct CachingAllocator::Block {
  std::uintptr_t ptr = 0;
  std::size_t size = 0;       // rounded size of this block
  std::size_t requested = 0;  // what the caller asked for (live blocks)
  CUstream stream = nullptr;  // stream its segment serves (that of the allocation that made or last took it)
  const Segment* segment = nullptr;
  bool small = false;  // lives in the small pool
  bool allocated = false;
  std::uint64_t serial = 0;  // of its current allocation; never reused (see live_allocation)
  int pending_events = 0;    // frees waiting on these events before reuse
  Block* prev = nullptr;     // neighbours inside the segment
  Block* next = nullptr;
  // Live: streams named in record_stream. Freed: streams whose event could
  // not be recorded yet; the block waits for a retry (see record_events).
  std::vector<CUstream> stream_uses;
  bool retiring = false;  // a head out of the pool, unmapped once its stream's event completes

  bool is_free() const { return !allocated && pending_events == 0 && stream_uses.empty(); }
};

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
// allocator skips its event queries during captures instead).
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
  // arena_ unmaps the segments (telling observers) when it is destroyed.
}

CachingAllocator::Pool& CachingAllocator::pool_of(const Block* block) {
  return block->small ? small_pool_ : large_pool_;
}

void* CachingAllocator::allocate(std::size_t bytes, CUstream stream) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  RelaxedCapture relaxed(drv_);
  SYMMPOOL_EXPECTS(bytes <= device_total_, "cannot allocate " + format_bytes(bytes) + ": more than device " +
                                               std::to_string(device()) + "'s total memory of " +
                                               format_bytes(device_total_));
  process_events();

  const std::size_t size = round_size(bytes);
  const bool small = size <= kSmallSize;
  Pool& pool = small ? small_pool_ : large_pool_;

  Block* block = find_free_block(pool, stream, size);
  if (block != nullptr) {
    ++stats_.cache_hits;
    pool.erase(block);
  } else {
    ++stats_.cache_misses;
    block = new_segment_block(size, bytes, stream, small);
  }
  block = split(block, size, pool);
  block->allocated = true;
  block->requested = bytes;
  block->serial = ++serials_;
  active_.emplace(block->ptr, block);

  ++stats_.allocations;
  stats_.add_blocks(small, 1, static_cast<std::int64_t>(block->size), static_cast<std::int64_t>(bytes));
  return reinterpret_cast<void*>(block->ptr);
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
                                                             CUstream stream, bool small) {
  const std::size_t want = segment_size_for(size);
  ContextGuard guard(drv_, arena_->context());
  if (!small) {
    retire_outgrown_segments(stream);
    if (move_idle_segments_)
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
  segment_heads_.emplace(segment->id, block);
  ++stats_.segment_maps;
  stats_.add_segments(small ? &stats_.small_pool : &stats_.large_pool, 1,
                      static_cast<std::int64_t>(segment->size));
  return block;
}

CachingAllocator::Block* CachingAllocator::split(Block* block, std::size_t size, Pool& pool) {
  const std::size_t remaining = block->size - size;
  const bool worth_it = block->small ? remaining >= kMinBlockSize : remaining > kSmallSize;
  if (!worth_it) return block;
  auto* rest = new Block;
  rest->ptr = block->ptr + size;
  rest->size = remaining;
  rest->stream = block->stream;
  rest->segment = block->segment;
  rest->small = block->small;
  rest->prev = block;
  rest->next = block->next;
  if (rest->next) rest->next->prev = rest;
  block->next = rest;
  block->size = size;
  pool.insert(rest);
  return block;
}

void CachingAllocator::deallocate(void* ptr, CUstream stream) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  RelaxedCapture relaxed(drv_);
  release(take_active(ptr), stream);
}

void CachingAllocator::deallocate(void* ptr, std::size_t bytes, CUstream stream) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  RelaxedCapture relaxed(drv_);
  auto it = active_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == active_.end()) throw_unknown_pointer(ptr, "free");
  SYMMPOOL_EXPECTS(it->second->requested == bytes,
                   "free of " + format_pointer(ptr) + " with size " + std::to_string(bytes) +
                       ", but it was allocated with size " + std::to_string(it->second->requested));
  Block* block = it->second;
  active_.erase(it);
  release(block, stream);
}

void CachingAllocator::deallocate_in_stream_order(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  RelaxedCapture relaxed(drv_);
  Block* block = take_active(ptr);
  release(block, block->stream);
}

CachingAllocator::Block* CachingAllocator::take_active(void* ptr) {
  auto it = active_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == active_.end()) throw_unknown_pointer(ptr, "free");
  Block* block = it->second;
  active_.erase(it);
  return block;
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
    free_block(block);
    return;
  }
  // The free itself is done; if an event cannot be recorded the block waits
  // out of the pool for a retry, and the caller hears of the failure.
  try {
    record_events(block);
  } catch (...) {
    unrecorded_.push_back(block);
    throw;
  }
}

void CachingAllocator::record_events(Block* block) {
  ContextGuard guard(drv_, arena_->context());
  // A stream leaves stream_uses only once its event is recorded, so a failure
  // keeps the block unfree. An event recorded later than the free still
  // covers all the work queued before it, so retrying is safe.
  while (!block->stream_uses.empty()) {
    CUevent event = take_event();
    CUresult r = drv_.cuEventRecord(event, block->stream_uses.back());
    if (r != CUDA_SUCCESS) {
      spare_events_.push_back(event);
      detail::throw_cuda_error(__FILE__, __LINE__, "cuEventRecord", r, drv_.error_string(r));
    }
    pending_.emplace_back(event, block);
    ++block->pending_events;
    block->stream_uses.pop_back();
  }
}

void CachingAllocator::retry_unrecorded_events() {
  while (!unrecorded_.empty()) {
    record_events(unrecorded_.back());  // on failure the block stays listed
    unrecorded_.pop_back();
  }
}

void CachingAllocator::free_block(Block* block) {
  Pool& pool = pool_of(block);
  if (Block* prev = block->prev; prev && prev->is_free()) {
    pool.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (prev->next) prev->next->prev = prev;
    delete block;
    block = prev;
  }
  if (Block* next = block->next; next && next->is_free()) {
    pool.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (block->next) block->next->prev = block;
    delete next;
  }
  pool.insert(block);
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

CUevent CachingAllocator::take_event() {
  if (!spare_events_.empty()) {
    CUevent e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  CUevent e = nullptr;
  SYMMPOOL_CU_TRY(drv_, cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  return e;
}

// Best effort: the failure was reported by the free, and the blocks stay out
// of the pool until a retry succeeds.
void CachingAllocator::try_retry_unrecorded_events() {
  try {
    retry_unrecorded_events();
  } catch (const cuda_error&) {
  }
}

void CachingAllocator::process_events() {
  try_retry_unrecorded_events();
  if (!retiring_.empty()) finish_retiring(/*wait=*/false);
  if (pending_.empty()) return;
  ContextGuard guard(drv_, arena_->context());
  for (auto it = pending_.begin(); it != pending_.end();) {
    CUresult r = drv_.cuEventQuery(it->first);
    if (r == CUDA_ERROR_NOT_READY) {
      ++it;
      continue;
    }
    if (r != CUDA_SUCCESS)
      detail::throw_cuda_error(__FILE__, __LINE__, "cuEventQuery", r, drv_.error_string(r));
    spare_events_.push_back(it->first);
    Block* block = it->second;
    it = pending_.erase(it);
    --block->pending_events;
    if (block->is_free()) free_block(block);
  }
}

void CachingAllocator::synchronize_events() {
  retry_unrecorded_events();  // a failure here is reported: we cannot wait for those blocks
  synchronize_pending_events();
}

void CachingAllocator::synchronize_pending_events() {
  if (pending_.empty()) return;
  ContextGuard guard(drv_, arena_->context());
  for (auto& [event, block] : pending_) SYMMPOOL_CU_TRY(drv_, cuEventSynchronize(event));
  process_events();
}

// A segment a symmetric heap published stays: its peers map it, and freeing
// it alone would let a new segment take its offset under them.
bool CachingAllocator::releasable(const Block* head) const {
  return head->next == nullptr && head->is_free() && !head->retiring &&
         !arena_->observers_keep(*head->segment);
}

void CachingAllocator::unmap_free_segment(Block* head) {
  pool_of(head).erase(head);
  const Segment* segment = head->segment;
  const std::size_t size = segment->size;
  PoolStats* pool = head->small ? &stats_.small_pool : &stats_.large_pool;
  segment_heads_.erase(segment->id);
  delete head;
  ++stats_.segment_unmaps;
  stats_.add_segments(pool, -1, static_cast<std::int64_t>(size));
  arena_->unmap_segment(segment);
}

// Unmaps `head`'s segment; its bytes, or 0 with the failure kept in
// `first_failure` (if none is there yet) and, given `say_as`, said on
// stderr, so that the caller goes on to the next segment.
std::size_t CachingAllocator::unmap_keeping_failure(Block* head, std::exception_ptr& first_failure,
                                                    const char* say_as) {
  const std::size_t size = head->segment->size;
  try {
    unmap_free_segment(head);
    return size;
  } catch (const std::exception& e) {
    if (!first_failure) first_failure = std::current_exception();
    if (say_as) SYMMPOOL_WARN(kAlloc, "%s failed: %s", say_as, e.what());
    return 0;
  }
}

std::size_t CachingAllocator::release_cached_segments() {
  ContextGuard guard(drv_, arena_->context());
  std::vector<Block*> idle;
  for (auto& [id, head] : segment_heads_)
    if (releasable(head)) idle.push_back(head);
  if (idle.empty() && retiring_.empty()) return 0;
  // Blocks are free in stream order: work queued before their free may still
  // use them, and cuMemUnmap is not known to wait for it as cudaFree does
  // (PyTorch's expandable segments sync before they unmap for that reason).
  // So the device finishes first; where it cannot (a capture under way, a
  // sticky error), the error names the call and nothing is unmapped.
  SYMMPOOL_CU_TRY(drv_, cuCtxSynchronize());
  // Every segment gets its unmap even where one fails; the first failure is
  // thrown once all were tried.
  std::exception_ptr first_failure;
  std::size_t released = finish_retiring(/*wait=*/true, &first_failure);
  for (Block* head : idle) released += unmap_keeping_failure(head, first_failure);
  if (first_failure) std::rethrow_exception(first_failure);
  return released;
}

// On a miss in the large pool every whole-free segment of `stream` is
// smaller than the request (one at least as large would have served it), so
// mapping beside them would size the pool by its history instead of its
// peak: requests that grow (FSDP2's reduce-scatter inputs, block by block
// and then the root's) would keep every smaller segment they outgrew. Those
// are retired, as expandable segments would grow one range instead: out of
// the pool at once, unmapped once the work queued on `stream` before now
// has finished (an event, checked here and at later allocations). Only that
// stream's work can still use them (frees from other streams wait on
// events, so those blocks are not free yet). No wait here: the lock is held
// and the stream may be waiting on a peer. Nothing is retired in a capture
// (no event outside the graph) or where the event cannot be recorded.
void CachingAllocator::retire_outgrown_segments(CUstream stream) {
  std::vector<Block*> outgrown;
  for (auto& [id, head] : segment_heads_)
    if (!head->small && head->stream == stream && releasable(head)) outgrown.push_back(head);
  if (outgrown.empty()) return;
  CUevent event = record_outside_capture(stream);
  if (event == nullptr) return;
  for (Block* head : outgrown) {
    pool_of(head).erase(head);
    head->retiring = true;
  }
  stats_.outgrown_segment_releases += outgrown.size();
  retiring_.push_back(Retiring{event, std::move(outgrown)});
  finish_retiring(/*wait=*/false);  // an idle stream: unmapped now
}

// A capture on `stream`, or no answer from the driver: either way no event
// recorded outside the graph can order its work.
bool CachingAllocator::capturing(CUstream stream) const {
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  return drv_.cuStreamIsCapturing(stream, &capture) != CUDA_SUCCESS ||
         capture != CU_STREAM_CAPTURE_STATUS_NONE;
}

// An event recorded on `stream` now, for the steps that save memory; null
// where the stream captures or the event cannot be made or recorded (saving
// memory is not worth failing the request for).
CUevent CachingAllocator::record_outside_capture(CUstream stream) {
  if (capturing(stream)) return nullptr;
  CUevent event = nullptr;
  try {
    event = take_event();
  } catch (const std::exception&) {
    return nullptr;
  }
  if (drv_.cuEventRecord(event, stream) != CUDA_SUCCESS) {
    spare_events_.push_back(event);
    return nullptr;
  }
  return event;
}

// Before mapping, a large request takes a whole-free segment that another
// stream keeps idle, of its size or up to a quarter larger (the smallest,
// then the lowest address: ranks that allocate alike choose alike, so
// symmetric buffers stay at equal offsets). Per-stream pools otherwise add
// their peaks: in FSDP2 the all-gather buffers of the copy-in stream lie
// idle at the end of backward, when the reduce-scatter stream needs the
// root's gradient (docs/fsdp2_flag_memory.md, change 2, has the device
// peak before and after). The requesting stream waits for an
// event recorded on the segment's stream: work queued there before now may
// still use it (frees from other streams wait on events, so their blocks are
// not free yet). Not in a capture (no event outside the graph), nor where
// the event cannot be recorded or waited for: then a segment is mapped.
// The wait covers all the old stream's queued work, not only this
// segment's; and the old stream must still exist, as PyTorch's expandable
// segments assume when they synchronize a segment's stream before unmapping.
// Uses on other streams must be ordered before the free (record_stream, or
// the freeing stream waiting on them, as FSDP2 does), not only before the
// old stream's next work: SYMMPOOL_SEGMENT_MOVES=0 keeps segments on their
// stream for code that relies on the latter.
CachingAllocator::Block* CachingAllocator::take_idle_segment_of_another_stream(std::size_t size,
                                                                               CUstream stream) {
  const std::size_t most = size + size / 4;
  Block* best = nullptr;
  for (auto& [id, head] : segment_heads_) {
    if (head->small || head->stream == stream || head->next != nullptr || !head->is_free() || head->retiring)
      continue;
    if (head->size < size || head->size > most) continue;
    if (best == nullptr || head->size < best->size || (head->size == best->size && head->ptr < best->ptr))
      best = head;
  }
  if (best == nullptr || capturing(stream)) return nullptr;
  CUevent event = record_outside_capture(best->stream);
  if (event == nullptr) return nullptr;  // a new segment serves the request instead
  // The wait holds the event's state at the call: it can be reused at once.
  spare_events_.push_back(event);
  if (drv_.cuStreamWaitEvent(stream, event, 0) != CUDA_SUCCESS) return nullptr;
  large_pool_.erase(best);  // keyed by its stream: out before the key changes
  best->stream = stream;
  ++stats_.segment_stream_moves;
  return best;
}

// Unmaps the retired segments whose event completed (all of them with
// `wait`, after the caller synchronized the device); returns the bytes. A
// heap that published one since it retired (a sync while its stream was
// busy) keeps it: peers map it now, so it goes back to the pool. A failed
// unmap goes to `failure` where the caller gives one (the others are still
// tried), and to stderr otherwise (an allocation is not the place to fail for it).
std::size_t CachingAllocator::finish_retiring(bool wait, std::exception_ptr* failure) {
  ContextGuard guard(drv_, arena_->context());
  std::size_t released = 0;
  std::exception_ptr unclaimed;  // where the caller takes no failure
  for (auto it = retiring_.begin(); it != retiring_.end();) {
    if (!wait && drv_.cuEventQuery(it->event) != CUDA_SUCCESS) {  // not yet, or the next wait reports it
      ++it;
      continue;
    }
    Retiring done = std::move(*it);
    it = retiring_.erase(it);
    spare_events_.push_back(done.event);
    for (Block* head : done.heads) {
      head->retiring = false;
      if (arena_->observers_keep(*head->segment)) {
        pool_of(head).insert(head);
        continue;
      }
      released += failure ? unmap_keeping_failure(head, *failure)
                          : unmap_keeping_failure(head, unclaimed, "unmapping an outgrown segment");
    }
  }
  return released;
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
    SegmentSnapshot segment{head->segment->address, head->segment->size, head->stream, head->small, {}};
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
