// CachingAllocator's private pools (CUDA graphs, torch.cuda.MemPool), as
// PyTorch's allocator keeps them: which allocations go to one, their use
// counts, giving their segments back, and the checkpoints CUDA graph trees
// take and put back.

#include "caching_allocator_block.hpp"

#include <symmpool/detail/format.hpp>
#include <symmpool/error.hpp>

#include <algorithm>
#include <string>

namespace symmpool {

using detail::format_pointer;

namespace {

std::string pool_name(PoolId id) {
  return "private pool (" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
}

}  // namespace

CachingAllocator::PrivatePool* CachingAllocator::route(CUstream stream) const {
  for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
    auto pool = private_pools_.find(it->first);
    if (pool != private_pools_.end() && it->second(stream)) return pool->second.get();
  }
  return nullptr;
}

CachingAllocator::PrivatePool& CachingAllocator::private_pool(PoolId id, const char* action) const {
  auto it = private_pools_.find(id);
  SYMMPOOL_EXPECTS(it != private_pools_.end(),
                   std::string(action) + ": no " + pool_name(id) + " on device " + std::to_string(device()));
  return *it->second;
}

void CachingAllocator::create_or_incref_pool(PoolId id) {
  SYMMPOOL_EXPECTS(id != kDefaultPool, "create_or_incref_pool: (0, 0) names the default pool");
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, created] = private_pools_.try_emplace(id);
  if (created) {
    it->second = std::make_unique<PrivatePool>();
    it->second->id = id;
    return;
  }
  // A pool nothing uses keeps only what is still live in it: it cannot be used again.
  SYMMPOOL_EXPECTS(!it->second->unused(), "create_or_incref_pool: " + pool_name(id) + " was released");
  ++it->second->use_count;
}

void CachingAllocator::begin_allocate_to_pool(PoolId id, StreamFilter accepts) {
  SYMMPOOL_EXPECTS(accepts != nullptr, "begin_allocate_to_pool: no stream filter");
  create_or_incref_pool(id);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [routed, filter] : routes_)
    SYMMPOOL_EXPECTS(routed != id, "begin_allocate_to_pool: already allocating to " + pool_name(id));
  routes_.emplace_back(id, std::move(accepts));
}

void CachingAllocator::end_allocate_to_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(routes_.begin(), routes_.end(), [&](const auto& r) { return r.first == id; });
  SYMMPOOL_EXPECTS(it != routes_.end(), "end_allocate_to_pool: not allocating to " + pool_name(id));
  routes_.erase(it);
}

void CachingAllocator::release_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  PrivatePool& pool = private_pool(id, "release_pool");
  SYMMPOOL_EXPECTS(!pool.unused(), "release_pool: " + pool_name(id) + " was already released");
  if (--pool.use_count == 0 && pool.segments == 0) private_pools_.erase(id);
}

int CachingAllocator::pool_use_count(PoolId id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return private_pool(id, "pool_use_count").use_count;
}

std::size_t CachingAllocator::empty_pool_cache(PoolId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = private_pools_.find(id);
  if (it == private_pools_.end() || !it->second->unused()) return 0;  // as PyTorch: only pools nothing uses
  synchronize_events();
  return release_cached_segments(it->second.get());
}

bool CachingAllocator::pool_live_allocations_are(PoolId id, const std::unordered_set<void*>& expected) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const PrivatePool* pool = &private_pool(id, "pool_live_allocations_are");
  std::size_t live = 0;
  for (const auto& [ptr, block] : active_) {
    if (block->owner != pool) continue;
    if (expected.count(reinterpret_cast<void*>(ptr)) == 0) return false;
    ++live;
  }
  return live == expected.size();
}

PoolCheckpoint CachingAllocator::checkpoint_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const PrivatePool& pool = private_pool(id, "checkpoint_pool");
  SYMMPOOL_EXPECTS(!pool.unused(), "checkpoint_pool: " + pool_name(id) + " was released");
  PoolCheckpoint checkpoint;
  checkpoint.pool = id;
  for (const auto& [segment, head] : segment_heads_) {
    if (head->owner != &pool) continue;
    PoolCheckpoint::Segment s{head->segment->address, head->segment->size, {}};
    for (const Block* b = head; b != nullptr; b = b->next)
      s.blocks.push_back({b->ptr, b->size, b->requested, b->allocated});
    checkpoint.segments.push_back(std::move(s));
  }
  std::sort(checkpoint.segments.begin(), checkpoint.segments.end(),
            [](const auto& a, const auto& b) { return a.address < b.address; });
  return checkpoint;
}

// As PyTorch's setCheckpointPoolState: free everything live in the pool, then
// carve each checkpointed segment into its blocks again, the live ones live.
PoolRestore CachingAllocator::restore_pool(const PoolCheckpoint& checkpoint) {
  std::lock_guard<std::mutex> lock(mutex_);
  PrivatePool& pool = private_pool(checkpoint.pool, "restore_pool");
  SYMMPOOL_EXPECTS(!pool.unused(), "restore_pool: " + pool_name(checkpoint.pool) + " was released");
  // Every checkpointed segment must still be the pool's before anything changes.
  for (const PoolCheckpoint::Segment& s : checkpoint.segments) {
    const Segment* segment = arena_->find(s.address);
    SYMMPOOL_EXPECTS(!s.blocks.empty() && segment != nullptr && segment->address == s.address &&
                         segment->size == s.size && segment_heads_.at(segment->id)->owner == &pool,
                     "restore_pool: the checkpoint's segment at " +
                         format_pointer(reinterpret_cast<void*>(s.address)) + " is no longer in " +
                         pool_name(checkpoint.pool));
  }
  PoolRestore restore;
  free_live_blocks_of(pool, restore);
  for (const PoolCheckpoint::Segment& s : checkpoint.segments) carve_checkpoint_segment(s, restore);
  return restore;
}

// Frees the pool's live blocks in their streams' order, then waits for
// every pending free: a segment is carved again only whole and free.
void CachingAllocator::free_live_blocks_of(PrivatePool& pool, PoolRestore& restore) {
  std::vector<Block*> live;
  for (const auto& [ptr, block] : active_)
    if (block->owner == &pool) live.push_back(block);
  std::sort(live.begin(), live.end(), [](const Block* a, const Block* b) { return a->ptr < b->ptr; });
  for (Block* block : live) {
    restore.freed.push_back(reinterpret_cast<void*>(block->ptr));
    active_.erase(block->ptr);
    release(block, block->stream);
  }
  synchronize_events();
}

void CachingAllocator::carve_checkpoint_segment(const PoolCheckpoint::Segment& s, PoolRestore& restore) {
  Block* rest = segment_heads_.at(arena_->find(s.address)->id);
  SYMMPOOL_EXPECTS(rest->next == nullptr && rest->is_free(),
                   "restore_pool: the segment at " + format_pointer(reinterpret_cast<void*>(s.address)) +
                       " still has blocks in use after its live ones were freed");
  Pool& free_blocks = pool_of(rest);
  pool_erase(free_blocks, rest);
  std::vector<Block*> carved;
  for (const PoolCheckpoint::Block& b : s.blocks) {
    SYMMPOOL_EXPECTS(rest != nullptr && rest->ptr == b.address && b.size <= rest->size,
                     "restore_pool: the checkpoint's blocks do not tile the segment at " +
                         format_pointer(reinterpret_cast<void*>(s.address)));
    Block* block = split_at(rest, b.size, free_blocks);
    rest = block->next;
    if (rest != nullptr) pool_erase(free_blocks, rest);  // split_at put it there; carved next
    carved.push_back(block);
  }
  SYMMPOOL_EXPECTS(rest == nullptr, "restore_pool: the checkpoint's blocks do not cover the segment at " +
                                        format_pointer(reinterpret_cast<void*>(s.address)));
  for (std::size_t i = 0; i < carved.size(); ++i) {
    if (s.blocks[i].allocated) {
      make_live(carved[i], s.blocks[i].requested);
      restore.allocated.push_back(reinterpret_cast<void*>(carved[i]->ptr));
    }
  }
  // The free ones go back to the pool through free_block, which merges
  // each with its free neighbours: a run of free blocks becomes one. The
  // next block, where free, is merged into this one and gone: skipped.
  for (std::size_t i = 0; i < carved.size(); ++i) {
    if (carved[i]->allocated) continue;
    const bool next_merged = i + 1 < carved.size() && !carved[i + 1]->allocated;
    free_block(carved[i]);
    if (next_merged) ++i;
  }
}

}  // namespace symmpool
