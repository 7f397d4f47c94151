#pragma once
// The caching allocator of one device: blocks inside physical segments, split
// on allocation and merged on free, in a small and a large pool, reused in
// stream order like PyTorch's CUDACachingAllocator. Thread-safe. It caches
// for the segment arena it is given (as RMM's adaptors wrap an upstream
// resource): the arena makes and maps segments, this class carves blocks.

#include <symmpool/allocator_stats.hpp>
#include <symmpool/driver_api.hpp>
#include <symmpool/segment_arena.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

namespace symmpool {

// One live allocation: where it starts, the bytes asked for, and a serial no
// other allocation of the same allocator ever gets (a buffer freed and
// allocated again at the same address gets a new one).
struct LiveAllocation {
  std::uintptr_t start = 0;
  std::size_t bytes = 0;
  std::uint64_t serial = 0;
};

// One segment of a pool as CachingAllocator::snapshot() sees it, its
// blocks in address order (torch.cuda.memory_snapshot's segments).
struct BlockSnapshot {
  std::uintptr_t address = 0;
  std::size_t size = 0;       // rounded
  std::size_t requested = 0;  // asked for (live blocks)
  bool allocated = false;
  bool pending = false;  // freed, waiting for work on its streams before reuse
};
struct SegmentSnapshot {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  CUstream stream = nullptr;  // the stream it serves
  bool small = false;         // in the small pool
  std::vector<BlockSnapshot> blocks;
};

class CachingAllocator {
 public:
  static constexpr std::size_t kMinBlockSize = 512;        // every size rounds up to this
  static constexpr std::size_t kSmallSize = 1 << 20;       // largest "small" request
  static constexpr std::size_t kSmallSegment = 2 << 20;    // segments of the small pool
  static constexpr std::size_t kMinLargeAlloc = 10 << 20;  // below: share a large segment
  static constexpr std::size_t kLargeSegment = 20 << 20;   // segments for mid-size requests
  static constexpr std::size_t kLargeRounding = 2 << 20;   // big requests round to this

  // Owns `arena` (its device, driver table and address range).
  // `move_idle_segments`: a large request may take a segment another stream
  // keeps idle (take_idle_segment_of_another_stream); SYMMPOOL_SEGMENT_MOVES=0
  // turns it off for the device allocators.
  explicit CachingAllocator(std::unique_ptr<SegmentArena> arena, bool move_idle_segments = true);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // `bytes` on `stream`; nullptr for 0 bytes (as cudaMalloc). Throws
  // out_of_memory when even an emptied cache cannot serve it and logic_error
  // for sizes beyond the device's memory or too large to round up.
  void* allocate(std::size_t bytes, CUstream stream);

  // Frees `ptr`, reusable once the work queued on `stream` (and on any stream
  // named in record_stream) has finished. nullptr is ignored. Throws
  // logic_error for pointers it did not hand out and double frees. Throws
  // cuda_error when an event for the other streams cannot be recorded: the
  // free is still done, and the block stays out of the pool until a later
  // allocate or empty_cache records the event (empty_cache reports a retry
  // that fails again).
  void deallocate(void* ptr, CUstream stream);
  // As above, checking that `bytes` is what was asked for.
  void deallocate(void* ptr, std::size_t bytes, CUstream stream);

  // Frees `ptr` in the order of the stream it was allocated on (PyTorch's
  // caching allocator frees the same way; record_stream names the others).
  void deallocate_in_stream_order(void* ptr);

  // `ptr` is used on `stream` too: its block is reused only after that work.
  void record_stream(void* ptr, CUstream stream);

  // Waits for pending frees, then unmaps every segment with no live block.
  // Returns the bytes given back to the device.
  std::size_t empty_cache();

  // Internal segments (SegmentArena::map_internal_segment): one granule at
  // a fixed slot, outside the pools; counted as reserved memory.
  void* map_internal_segment(int slot);
  void unmap_internal_segment(void* ptr);
  std::uint64_t free_internal_slots() const;  // bit s: slot s is free

  bool owns(const void* ptr) const;                    // inside one of our segments
  bool is_allocation(const void* ptr) const;           // the start of a live block
  std::size_t allocation_size(const void* ptr) const;  // bytes asked for; throws if unknown
  // The live allocation that holds all of [ptr, ptr + bytes), or nullopt
  // (freed, not ours, or spilling past the bytes asked for).
  std::optional<LiveAllocation> live_allocation(const void* ptr, std::size_t bytes) const;

  AllocatorStats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();  // AllocatorStats::reset_accumulated

  // Registration hooks: see SegmentArena::add_observer / remove_observer.
  void add_observer(SegmentObserver* observer, bool replay_existing);
  void remove_observer(SegmentObserver* observer, bool replay_existing) noexcept;
  // Runs `step` under the allocator's lock, for an observer's step that must
  // not fall between the allocator finding a segment releasable (no
  // observer keeps it) and unmapping it: a heap publishing its segments.
  // `step` must not call back into the allocator.
  template <typename Step>
  auto with_lock(Step&& step) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return step();
  }

  std::vector<Segment> segments() const;  // copies, for inspection
  // The pools' segments and their blocks (internal segments are in neither).
  std::vector<SegmentSnapshot> snapshot() const;
  // The largest block free for reuse now, in bytes (0 if none).
  std::size_t largest_free_block() const;
  int device() const { return arena_->device(); }
  std::size_t device_total_memory() const { return device_total_; }
  const MulticastDecision& multicast() const { return arena_->multicast(); }
  std::size_t granularity() const { return arena_->granularity(); }
  // The reserved virtual range every segment lives in (offsets are from its base).
  CUdeviceptr va_base() const { return arena_->va_base(); }
  std::size_t va_reserved_bytes() const { return arena_->va_reserved_bytes(); }
  CUcontext context() const { return arena_->context(); }

 private:
  struct Block;
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockLess>;

  Block* find_free_block(Pool& pool, CUstream stream, std::size_t size);
  Block* new_segment_block(std::size_t size, std::size_t requested, CUstream stream, bool small);
  Block* split(Block* block, std::size_t size, Pool& pool);
  Block* take_active(void* ptr);                // removes a live block; throws if unknown
  void release(Block* block, CUstream stream);  // a block just taken from active_
  void free_block(Block* block);
  void record_events(Block* block);  // for its stream_uses; throws cuda_error
  void retry_unrecorded_events();    // throws cuda_error, keeping the failed ones
  void try_retry_unrecorded_events();
  void process_events();
  void synchronize_events();          // every free, unrecorded ones included
  void synchronize_pending_events();  // the recorded ones
  std::size_t release_cached_segments();
  void retire_outgrown_segments(CUstream stream);
  Block* take_idle_segment_of_another_stream(std::size_t size, CUstream stream);
  bool capturing(CUstream stream) const;
  CUevent record_outside_capture(CUstream stream);
  std::size_t finish_retiring(bool wait, std::exception_ptr* failure = nullptr);
  std::size_t unmap_keeping_failure(Block* head, std::exception_ptr& first_failure,
                                    const char* say_as = nullptr);
  bool releasable(const Block* head) const;  // a whole segment, free, no peer maps it
  void unmap_free_segment(Block* head);      // head: releasable
  CUevent take_event();
  Pool& pool_of(const Block* block);
  std::size_t largest_free_block_locked() const;
  [[noreturn]] void throw_unknown_pointer(const void* ptr, const char* action) const;

  const DriverApi& drv_;                 // declared before arena_: taken from the arena before it is moved in
  std::unique_ptr<SegmentArena> arena_;  // never null
  std::size_t device_total_ = 0;
  bool move_idle_segments_ = true;
  mutable std::mutex mutex_;
  Pool small_pool_;
  Pool large_pool_;
  std::unordered_map<std::uintptr_t, Block*> active_;
  std::unordered_map<std::uint64_t, Block*> segment_heads_;  // segment id -> first block
  std::deque<std::pair<CUevent, Block*>> pending_;           // frees waiting on events
  std::vector<Block*> unrecorded_;                           // frees whose events failed to record, to retry
  std::vector<CUevent> spare_events_;
  struct Retiring {
    CUevent event;              // recorded on the segments' stream when they were retired
    std::vector<Block*> heads;  // whole-free segments, out of the pool
  };
  std::vector<Retiring> retiring_;
  AllocatorStats stats_;
  std::uint64_t serials_ = 0;  // allocations made so far
};

}  // namespace symmpool
