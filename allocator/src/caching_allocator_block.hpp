#pragma once
// CachingAllocator's block, shared by the files that implement the class:
// caching_allocator.cpp (allocation and free), caching_allocator_events.cpp
// (stream order: events), caching_allocator_segments.cpp (giving segments
// back, retiring and moving them), caching_allocator_inspect.cpp (queries,
// statistics, snapshots), caching_allocator_pools.cpp (private pools).

#include <symmpool/caching_allocator.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace symmpool {

struct CachingAllocator::Block {
  std::uintptr_t ptr = 0;
  std::size_t size = 0;       // rounded size of this block
  std::size_t requested = 0;  // what the caller asked for (live blocks)
  CUstream stream = nullptr;  // stream its segment serves (that of the allocation that made or last took it)
  const Segment* segment = nullptr;
  bool small = false;            // lives in the small pool
  PrivatePool* owner = nullptr;  // the private pool of its segment; null: the default pool
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

// A private pool (CUDA graphs, torch.cuda.MemPool): its own free blocks, so
// that its segments serve only its allocations.
struct CachingAllocator::PrivatePool {
  PoolId id;
  int use_count = 1;
  std::size_t segments = 0;  // mapped for it and not yet unmapped
  Pool small;
  Pool large;

  bool unused() const { return use_count == 0; }  // its segments may go back once free
};

}  // namespace symmpool
