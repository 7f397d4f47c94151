// CachingAllocator's segments going back to the device: whole-free ones
// unmapped (empty_cache, an allocation's retry), outgrown ones retired once
// their stream's work is done, and idle ones of another stream taken
// instead of a new mapping.

#include "caching_allocator_block.hpp"

#include <symmpool/detail/format.hpp>
#include <symmpool/error.hpp>
#include <symmpool/log.hpp>

#include <algorithm>
#include <exception>

namespace symmpool {

using detail::format_bytes;

// A segment a symmetric heap published stays: its peers map it, and freeing
// it alone would let a new segment take its offset under them.
// A private pool's segments stay while anything uses the pool: a graph's
// replays write into them.
bool CachingAllocator::releasable(const Block* head) const {
  return head->next == nullptr && head->is_free() && !head->retiring &&
         (head->owner == nullptr || head->owner->unused()) && !arena_->observers_keep(*head->segment);
}

void CachingAllocator::unmap_free_segment(Block* head, RangeAfterUnmap after) {
  pool_erase(pool_of(head), head);
  const Segment* segment = head->segment;
  const std::size_t size = segment->size;
  PoolStats* pool = head->small ? &stats_.small_pool : &stats_.large_pool;
  PrivatePool* owner = head->owner;
  segment_heads_.erase(segment->id);
  delete head;
  ++stats_.segment_unmaps;
  stats_.add_segments(pool, -1, static_cast<std::int64_t>(size));
  if (owner != nullptr && --owner->segments == 0 && owner->unused()) private_pools_.erase(owner->id);
  arena_->unmap_segment(segment, after);
}

// Unmaps `head`'s segment; its bytes, or 0 with the failure kept in
// `first_failure` (if none is there yet) and, given `say_as`, said on
// stderr, so that the caller goes on to the next segment.
std::size_t CachingAllocator::unmap_keeping_failure(Block* head, std::exception_ptr& first_failure,
                                                    const char* say_as, RangeAfterUnmap after) {
  const std::size_t size = head->segment->size;
  try {
    unmap_free_segment(head, after);
    return size;
  } catch (const std::exception& e) {
    if (!first_failure) first_failure = std::current_exception();
    if (say_as) SYMMPOOL_WARN(kAlloc, "%s failed: %s", say_as, e.what());
    return 0;
  }
}

std::size_t CachingAllocator::release_cached_segments(const PrivatePool* only) {
  ContextGuard guard(drv_, arena_->context());
  std::vector<Block*> idle;
  for (auto& [id, head] : segment_heads_)
    if ((only == nullptr || head->owner == only) && releasable(head)) idle.push_back(head);
  const bool retired = only == nullptr && !retiring_.empty();
  // Ranges parked by unmaps that waited on events come back here, a point in
  // program order, whether or not anything else is left to unmap: a rank
  // whose outgrown segments were unmapped already must place its next
  // segments as one that unmaps them below.
  if (only == nullptr) arena_->release_parked_ranges();
  if (idle.empty() && !retired) return 0;
  // Blocks are free in stream order: work queued before their free may still
  // use them, and cuMemUnmap is not known to wait for it as cudaFree does
  // (PyTorch's expandable segments sync before they unmap for that reason).
  // So the device finishes first; where it cannot (a capture under way, a
  // sticky error), the error names the call and nothing is unmapped.
  SYMMPOOL_CU_TRY(drv_, cuCtxSynchronize());
  // Every segment gets its unmap even where one fails; the first failure is
  // thrown once all were tried.
  std::exception_ptr first_failure;
  std::size_t released = retired ? finish_retiring(/*wait=*/true, &first_failure) : 0;
  for (Block* head : idle) released += unmap_keeping_failure(head, first_failure);
  if (first_failure) std::rethrow_exception(first_failure);
  return released;
}

bool CachingAllocator::segment_retiring_locked(std::uint64_t id) const {
  auto it = segment_heads_.find(id);
  return it != segment_heads_.end() && it->second->retiring;
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
    if (!head->small && head->owner == nullptr && head->stream == stream && releasable(head))
      outgrown.push_back(head);
  if (outgrown.empty()) return;
  CUevent event = record_outside_capture(stream);
  if (event == nullptr) return;
  for (Block* head : outgrown) {
    pool_erase(pool_of(head), head);
    head->retiring = true;
  }
  stats_.outgrown_segment_releases += outgrown.size();
  retiring_.push_back(Retiring{event, std::move(outgrown)});
  finish_retiring(/*wait=*/false);  // an idle stream: unmapped now
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
    if (head->small || head->owner != nullptr || head->stream == stream || head->next != nullptr ||
        !head->is_free() || head->retiring)
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
  pool_erase(large_pool_, best);  // keyed by its stream: out before the key changes
  best->stream = stream;
  ++stats_.segment_stream_moves;
  return best;
}

// Unmaps the retired segments whose event completed (all of them with
// `wait`, after the caller synchronized the device); returns the bytes.
// Without `wait` the unmap's moment depends on the GPU's progress, so the
// segment's range is parked: the next segments' offsets must not depend on
// it (symmetric heaps need ranks that allocate alike to place alike). An
// observer that kept one mapped since it retired gets it back in the pool
// (heaps do not: they leave retiring segments out of their listings). A failed
// unmap goes to `failure` where the caller gives one (the others are still
// tried), and to stderr otherwise (an allocation is not the place to fail for it).
std::size_t CachingAllocator::finish_retiring(bool wait, std::exception_ptr* failure) {
  ContextGuard guard(drv_, arena_->context());
  std::size_t released = 0;
  std::exception_ptr unclaimed;  // where the caller takes no failure
  const RangeAfterUnmap after = wait ? RangeAfterUnmap::kRelease : RangeAfterUnmap::kPark;
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
        pool_insert(pool_of(head), head);
        continue;
      }
      released += failure ? unmap_keeping_failure(head, *failure, nullptr, after)
                          : unmap_keeping_failure(head, unclaimed, "unmapping an outgrown segment", after);
    }
  }
  return released;
}

}  // namespace symmpool
