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
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>
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

// A pool of an allocator: {0, 0} is its default pool; any other id names a
// private pool (a CUDA graph's, a torch.cuda.MemPool's), as PyTorch's
// MempoolId_t does.
using PoolId = std::pair<std::uint64_t, std::uint64_t>;
inline constexpr PoolId kDefaultPool{0, 0};
// Which allocations go to a private pool: those whose stream it accepts.
using StreamFilter = std::function<bool(CUstream)>;

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
  PoolId pool = kDefaultPool;
  std::vector<BlockSnapshot> blocks;
};

// The layout of a private pool at one moment: its segments and which of
// their blocks were live (CachingAllocator::checkpoint_pool), to put back
// with restore_pool: CUDA graph trees record a new graph after replaying
// others, whose outputs the pool does not know of (PyTorch's
// setCheckpointPoolState).
struct PoolCheckpoint {
  struct Block {
    std::uintptr_t address = 0;
    std::size_t size = 0;
    std::size_t requested = 0;
    bool allocated = false;
  };
  struct Segment {
    std::uintptr_t address = 0;
    std::size_t size = 0;
    std::vector<Block> blocks;
  };
  PoolId pool = kDefaultPool;
  std::vector<Segment> segments;
};
// What restore_pool changed: the live allocations it freed and those it
// made (the checkpoint's live blocks), by address.
struct PoolRestore {
  std::vector<void*> freed;
  std::vector<void*> allocated;
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

  // Waits for pending frees, then unmaps every segment with no live block
  // (of the default pool and of private pools nothing uses any more).
  // Returns the bytes given back to the device.
  std::size_t empty_cache();

  // Private pools, as PyTorch's allocator keeps them for CUDA graphs and
  // torch.cuda.MemPool: their segments serve only their own allocations,
  // and go back to the device only once nothing uses the pool
  // (release_pool to a use count of 0) and none of their blocks is live.
  // Creates the pool with a use count of 1, or adds one to it.
  void create_or_incref_pool(PoolId id);
  // From now on an allocation whose stream `accepts` goes to pool `id`
  // (created or incref'd as above); the latest begun is asked first. Throws
  // logic_error for the default pool or a pool already routed to.
  void begin_allocate_to_pool(PoolId id, StreamFilter accepts);
  void end_allocate_to_pool(PoolId id);  // throws logic_error if not routed to
  void release_pool(PoolId id);          // one use fewer; throws logic_error for an unknown pool
  int pool_use_count(PoolId id) const;   // throws logic_error for an unknown pool
  // Unmaps the free segments of private pool `id` if nothing uses it any
  // more (as empty_cache does for all of them); returns the bytes.
  std::size_t empty_pool_cache(PoolId id);
  // Whether the live allocations of pool `id` are exactly `expected`.
  bool pool_live_allocations_are(PoolId id, const std::unordered_set<void*>& expected) const;
  PoolCheckpoint checkpoint_pool(PoolId id);
  // Frees every live allocation of the checkpoint's pool, then makes the
  // checkpoint's live blocks live again at their addresses. Every segment of
  // the checkpoint must still be in the pool. Throws logic_error otherwise,
  // or for a pool nothing uses any more.
  PoolRestore restore_pool(const PoolCheckpoint& checkpoint);

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
  // Inside with_lock only: whether segment `id` is retiring (outgrown, to be
  // unmapped once its stream's work is done, a moment the GPU decides). A
  // heap leaves it out of what it publishes, so that ranks whose GPUs
  // finished at other times still hold the same published segments.
  bool segment_retiring_locked(std::uint64_t id) const;

  std::vector<Segment> segments() const;  // copies, for inspection
  // The pools' segments and their blocks (internal segments are in neither).
  std::vector<SegmentSnapshot> snapshot() const;
  // The largest block of the default pool free for reuse now, in bytes (0 if none).
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
  struct PrivatePool;

  Block* find_free_block(Pool& pool, CUstream stream, std::size_t size);
  Block* new_segment_block(std::size_t size, std::size_t requested, CUstream stream, bool small,
                           PrivatePool* owner);
  Block* split(Block* block, std::size_t size, Pool& pool);
  Block* split_at(Block* block, std::size_t size, Pool& pool);  // always; the rest goes to `pool`
  void make_live(Block* block, std::size_t requested);
  PrivatePool* route(CUstream stream) const;  // the private pool an allocation on `stream` goes to, or null
  PrivatePool& private_pool(PoolId id, const char* action) const;  // throws logic_error if unknown
  Pool& pool_for(PrivatePool* owner, bool small);
  // Some allocations go to a private pool (a capture or a MemPool context).
  bool routing_to_private_pool() const { return !routes_.empty(); }
  void free_live_blocks_of(PrivatePool& pool, PoolRestore& restore);
  void carve_checkpoint_segment(const PoolCheckpoint::Segment& segment, PoolRestore& restore);
  Block* take_active(void* ptr);  // removes a live block; throws if unknown
  Block* take_active(std::unordered_map<std::uintptr_t, Block*>::iterator it);
  void add_active(Block* block);  // a live block into active_, on a spare node where there is one
  Block* make_block();            // a spare Block, or a new one
  void drop_block(Block* block);  // back to the spares
  void pool_insert(Pool& pool, Block* block);
  void pool_erase(Pool& pool, Block* block);
  void release(Block* block, CUstream stream);  // a block just taken from active_
  void free_block(Block* block);                // into its pool, merged with free neighbours
  void free_at_last(Block* block);   // a freed block whose streams are done: no longer busy, then free_block
  void record_events(Block* block);  // for its stream_uses; throws cuda_error
  void retry_unrecorded_events();    // throws cuda_error, keeping the failed ones
  void try_retry_unrecorded_events();
  void process_events();
  void synchronize_events();          // every free, unrecorded ones included
  void synchronize_pending_events();  // the recorded ones
  // The releasable segments of `only` (of every pool, the retired ones too, where null) unmapped.
  std::size_t release_cached_segments(const PrivatePool* only = nullptr);
  void retire_outgrown_segments(CUstream stream);
  Block* take_idle_segment_of_another_stream(std::size_t size, CUstream stream);
  bool capturing(CUstream stream) const;
  CUevent record_outside_capture(CUstream stream);
  std::size_t finish_retiring(bool wait, std::exception_ptr* failure = nullptr);
  using RangeAfterUnmap = SegmentArena::RangeAfterUnmap;
  std::size_t unmap_keeping_failure(Block* head, std::exception_ptr& first_failure,
                                    const char* say_as = nullptr,
                                    RangeAfterUnmap after = RangeAfterUnmap::kRelease);
  bool releasable(const Block* head) const;  // a whole segment, free, no peer maps it
  void unmap_free_segment(Block* head,
                          RangeAfterUnmap after = RangeAfterUnmap::kRelease);  // head: releasable
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
  std::map<PoolId, std::unique_ptr<PrivatePool>> private_pools_;
  std::vector<std::pair<PoolId, StreamFilter>> routes_;  // begin_allocate_to_pool, in order
  std::unordered_map<std::uintptr_t, Block*> active_;
  std::unordered_map<std::uint64_t, Block*> segment_heads_;  // segment id -> first block
  std::deque<std::pair<CUevent, Block*>> pending_;           // frees waiting on events
  // Frees whose events failed to record, or wait for no capture to be under
  // way (an event recorded in a capture orders nothing outside it), to retry.
  std::vector<Block*> unrecorded_;
  std::vector<CUevent> spare_events_;
  struct Retiring {
    CUevent event;              // recorded on the segments' stream when they were retired
    std::vector<Block*> heads;  // whole-free segments, out of the pool
  };
  std::vector<Retiring> retiring_;
  AllocatorStats stats_;
  std::uint64_t serials_ = 0;  // allocations made so far
  // Blocks and container nodes that frees let go, kept for the next
  // allocations (a few thousand of each at most): a cache hit then asks
  // malloc for nothing (its new and delete were the hot path's largest cost).
  std::vector<Block*> spare_blocks_;
  std::vector<Pool::node_type> spare_pool_nodes_;
  std::vector<std::unordered_map<std::uintptr_t, Block*>::node_type> spare_active_nodes_;
};

}  // namespace symmpool
