#pragma once
// Counters of one caching allocator, in the spirit of torch.cuda.memory_stats.

#include <algorithm>
#include <cstdint>

namespace symmpool {

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  void add(std::int64_t n) {
    current += n;
    peak = std::max(peak, current);
  }
  void reset_peak() { peak = current; }
};

struct AllocatorStats {
  Stat allocated_bytes;  // bytes in live blocks (rounded sizes)
  Stat requested_bytes;  // bytes callers asked for in live blocks
  Stat reserved_bytes;   // bytes in mapped segments
  Stat active_blocks;    // live allocations
  Stat segments;         // mapped segments
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
};

}  // namespace symmpool
