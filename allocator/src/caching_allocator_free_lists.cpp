// CachingAllocator's free lists (the pools' sets) and the spares its hot
// path reuses: Blocks and container nodes that frees let go, kept (a few
// thousand of each at most) so that a cache hit asks malloc for nothing.

#include "caching_allocator_block.hpp"

#include <cstddef>
#include <utility>

namespace symmpool {

namespace {
constexpr std::size_t kMostSpares = 4096;  // of each kind
}  // namespace

CachingAllocator::Block* CachingAllocator::make_block() {
  if (spare_blocks_.empty()) return new Block;
  Block* block = spare_blocks_.back();
  spare_blocks_.pop_back();
  *block = Block{};
  return block;
}

void CachingAllocator::drop_block(Block* block) {
  if (spare_blocks_.size() < kMostSpares) {
    spare_blocks_.push_back(block);
  } else {
    delete block;
  }
}

// A free block counts as inactive_split while it is in a free list and
// shares its segment; neither changes while it is there (blocks are split
// and merged only out of the lists).
void CachingAllocator::pool_insert(Pool& pool, Block* block) {
  if (block->prev != nullptr || block->next != nullptr)
    stats_.add_inactive_split(block->small, 1, static_cast<std::int64_t>(block->size));
  if (spare_pool_nodes_.empty()) {
    pool.insert(block);
    return;
  }
  Pool::node_type node = std::move(spare_pool_nodes_.back());
  spare_pool_nodes_.pop_back();
  node.value() = block;
  pool.insert(std::move(node));
}

void CachingAllocator::pool_erase(Pool& pool, Block* block) {
  Pool::node_type node = pool.extract(block);
  if (node.empty()) return;
  if (block->prev != nullptr || block->next != nullptr)
    stats_.add_inactive_split(block->small, -1, static_cast<std::int64_t>(block->size));
  if (spare_pool_nodes_.size() < kMostSpares) spare_pool_nodes_.push_back(std::move(node));
}

void CachingAllocator::add_active(Block* block) {
  if (spare_active_nodes_.empty()) {
    active_.emplace(block->ptr, block);
    return;
  }
  auto node = std::move(spare_active_nodes_.back());
  spare_active_nodes_.pop_back();
  node.key() = block->ptr;
  node.mapped() = block;
  active_.insert(std::move(node));
}

CachingAllocator::Block* CachingAllocator::take_active(
    std::unordered_map<std::uintptr_t, Block*>::iterator it) {
  auto node = active_.extract(it);
  Block* block = node.mapped();
  if (spare_active_nodes_.size() < kMostSpares) spare_active_nodes_.push_back(std::move(node));
  return block;
}

}  // namespace symmpool
