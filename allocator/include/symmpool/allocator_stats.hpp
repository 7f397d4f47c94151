#pragma once
// Counters of one caching allocator, in the spirit of torch.cuda.memory_stats.

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>

namespace symmpool {

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t increased = 0;  // sum of the increases since the last reset_accumulated (torch's "allocated")
  std::int64_t decreased = 0;  // and of the decreases (torch's "freed")
  void add(std::int64_t n) {
    current += n;
    peak = std::max(peak, current);
    (n >= 0 ? increased : decreased) += n >= 0 ? n : -n;
  }
  void reset_peak() { peak = current; }
  void reset_accumulated() { increased = decreased = 0; }
};

// What one pool holds (PyTorch's small_pool and large_pool).
struct PoolStats {
  Stat allocated_bytes;
  Stat requested_bytes;
  Stat reserved_bytes;
  Stat active_blocks;
  Stat segments;
  // Live blocks and freed ones whose streams' work is still pending (torch's "active").
  Stat busy_blocks;
  Stat busy_bytes;
  // Free blocks in segments that also hold other blocks (torch's "inactive_split").
  Stat inactive_split_blocks;
  Stat inactive_split_bytes;

  std::array<Stat*, 9> stats() {
    return {&allocated_bytes, &requested_bytes, &reserved_bytes,        &active_blocks,       &segments,
            &busy_blocks,     &busy_bytes,      &inactive_split_blocks, &inactive_split_bytes};
  }
  void reset_peaks() {
    for (Stat* s : stats()) s->reset_peak();
  }
  void reset_accumulated() {
    for (Stat* s : stats()) s->reset_accumulated();
  }
};

struct AllocatorStats {
  Stat allocated_bytes;  // bytes in live blocks (rounded sizes)
  Stat requested_bytes;  // bytes callers asked for in live blocks
  Stat reserved_bytes;   // bytes in mapped segments
  Stat active_blocks;    // live allocations
  Stat segments;         // mapped segments
  Stat busy_blocks;      // as PoolStats'
  Stat busy_bytes;
  Stat inactive_split_blocks;
  Stat inactive_split_bytes;
  // The same, by pool; the totals above also hold the internal segments
  // (signal pads), which are in neither pool.
  PoolStats small_pool;
  PoolStats large_pool;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t cache_hits = 0;    // served from a cached block
  std::uint64_t cache_misses = 0;  // needed a new segment
  std::uint64_t segment_maps = 0;
  std::uint64_t segment_unmaps = 0;
  std::uint64_t outgrown_segment_releases = 0;  // retired for a larger request of their stream
  std::uint64_t segment_stream_moves = 0;       // idle segments another stream took instead of a map
  std::uint64_t oom_retries = 0;                // cache emptied to satisfy a request
  std::uint64_t ooms = 0;                       // requests that failed with out_of_memory

  // `count` (+1 or -1) live blocks of `size` rounded and `requested` asked-for bytes.
  void add_blocks(bool small, std::int64_t count, std::int64_t size, std::int64_t requested) {
    PoolStats& pool = small ? small_pool : large_pool;
    for (Stat* s : {&allocated_bytes, &pool.allocated_bytes}) s->add(count * size);
    for (Stat* s : {&requested_bytes, &pool.requested_bytes}) s->add(count * requested);
    for (Stat* s : {&active_blocks, &pool.active_blocks}) s->add(count);
  }
  // `count` (+1 or -1) blocks of `size` bytes that became busy (allocated) or stopped being so (free at
  // last).
  void add_busy(bool small, std::int64_t count, std::int64_t size) {
    PoolStats& pool = small ? small_pool : large_pool;
    for (Stat* s : {&busy_blocks, &pool.busy_blocks}) s->add(count);
    for (Stat* s : {&busy_bytes, &pool.busy_bytes}) s->add(count * size);
  }
  // `count` (+1 or -1) free blocks of `size` bytes of split segments entering or leaving the free lists.
  void add_inactive_split(bool small, std::int64_t count, std::int64_t size) {
    PoolStats& pool = small ? small_pool : large_pool;
    for (Stat* s : {&inactive_split_blocks, &pool.inactive_split_blocks}) s->add(count);
    for (Stat* s : {&inactive_split_bytes, &pool.inactive_split_bytes}) s->add(count * size);
  }
  // `count` (+1 or -1) segments of `size` bytes, in a pool or (`pool` null) internal.
  void add_segments(PoolStats* pool, std::int64_t count, std::int64_t size) {
    reserved_bytes.add(count * size);
    segments.add(count);
    if (pool == nullptr) return;
    pool->reserved_bytes.add(count * size);
    pool->segments.add(count);
  }
  // The totals, as PoolStats::stats() lists a pool's.
  std::array<Stat*, 9> totals() {
    return {&allocated_bytes, &requested_bytes, &reserved_bytes,        &active_blocks,       &segments,
            &busy_blocks,     &busy_bytes,      &inactive_split_blocks, &inactive_split_bytes};
  }
  void reset_peaks() {
    for (Stat* s : totals()) s->reset_peak();
    small_pool.reset_peaks();
    large_pool.reset_peaks();
  }
  // Zeroes what accumulates (the stats' increases and decreases, the
  // counters), as torch.cuda.reset_accumulated_memory_stats does.
  void reset_accumulated() {
    for (Stat* s : totals()) s->reset_accumulated();
    small_pool.reset_accumulated();
    large_pool.reset_accumulated();
    allocations = frees = cache_hits = cache_misses = segment_maps = segment_unmaps = 0;
    outgrown_segment_releases = segment_stream_moves = oom_retries = ooms = 0;
  }
};

}  // namespace symmpool
