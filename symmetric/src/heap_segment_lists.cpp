// SymmetricHeap's segment lists: what a rank sends at a sync (its
// segments' ids, offsets and sizes), how a peer's list is checked and
// applied, and which segments came out symmetric on every rank.

#include "symmetric_heap_internal.hpp"

#include <symmpool/detail/format.hpp>
#include <symmpool/error.hpp>
#include <symmpool/log.hpp>
#include <symmpool/node_identity.hpp>
#include <symmpool/random_token.hpp>
#include <symmpool/symmetric_heap.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>

namespace symmpool {

using detail::split_words;

// Lines of "id offset size" from `peer`: each must lie inside the range
// every rank reserved, in whole granules, with no id twice.
std::map<std::uint64_t, SymmetricHeap::Piece> SymmetricHeap::parse_segments(
    int peer, const std::string& listing) const {
  std::map<std::uint64_t, Piece> listed;
  const std::size_t range = allocator_.va_reserved_bytes(), granule = allocator_.granularity();
  std::size_t start = 0;
  while (start < listing.size()) {
    const std::size_t end = std::min(listing.find('\n', start), listing.size());
    const std::string line = listing.substr(start, end - start);
    start = end + 1;
    const std::vector<std::string> words = split_words(line);
    Piece p{};
    bool ok = words.size() == 3;
    for (std::size_t i = 0; ok && i < 3; ++i) {
      const std::string& w = words[i];
      ok = !w.empty() && w.size() <= 20 && w.find_first_not_of("0123456789") == std::string::npos;
    }
    if (ok) {
      p.id = std::strtoull(words[0].c_str(), nullptr, 10);
      p.offset = std::strtoull(words[1].c_str(), nullptr, 10);
      p.size = std::strtoull(words[2].c_str(), nullptr, 10);
      ok = p.size > 0 && p.size % granule == 0 && p.offset % granule == 0 && p.offset < range &&
           p.size <= range - p.offset && listed.emplace(p.id, p).second;
    }
    if (!ok)
      throw divergence_error("symmetric heap '" + group_ + "': rank " + std::to_string(peer) +
                             " published a malformed segment '" + line + "' (range " + std::to_string(range) +
                             " bytes, granule " + std::to_string(granule) + ")");
  }
  return listed;
}

// This rank's segments as "id offset size" lines; they are served to peers
// from now on and kept mapped while the heap lives (keeps_mapped).
// Under the allocator's lock (taken before ours, as its observer calls do):
// the allocator holds it from finding a segment unpublished to unmapping it,
// so a segment is never listed to the peers while it is being unmapped.
// Retiring segments stay out: when they go depends on the GPU's progress,
// and a rank that still had one would publish it (and keep it) where a
// rank that had unmapped it would not.
std::string SymmetricHeap::list_for_sync(std::uint64_t* generation) {
  return allocator_.with_lock([&] {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string mine;
    published_.clear();
    for (auto& [id, p] : local_) {
      if (allocator_.segment_retiring_locked(id)) continue;
      mine += std::to_string(p.id) + " " + std::to_string(p.offset) + " " + std::to_string(p.size) + "\n";
      published_.insert(id);
    }
    *generation = local_generation_;
    return mine;
  });
}

// Maps what each peer listed (listings[r], where listed[r]) and unmaps what
// it no longer lists; then meets every rank again, and only then counts
// this rank's listing (`generation`, if it listed) as synced.
void SymmetricHeap::apply_listings(const std::vector<std::string>& listings, const std::vector<bool>& listed,
                                   std::uint64_t generation) {
  // A rank that cannot apply them tells the others in the exchange below
  // and leaves, so that every rank fails at once, naming it, instead of
  // waiting for it.
  std::exception_ptr failure;
  std::string why;
  try {
    ContextGuard guard(drv_, allocator_.context());
    std::vector<std::map<std::uint64_t, Piece>> pieces(static_cast<std::size_t>(world_));
    for (int r = 0; r < world_; ++r)
      if (r != rank_ && listed[static_cast<std::size_t>(r)])
        pieces[static_cast<std::size_t>(r)] = parse_segments(r, listings[static_cast<std::size_t>(r)]);
    // Released ones first: their mappings retire (a new segment may reuse
    // their range), and are unmapped once the device has finished with them.
    for (int r = 0; r < world_; ++r) {
      if (r == rank_ || !listed[static_cast<std::size_t>(r)]) continue;
      const auto& now = pieces[static_cast<std::size_t>(r)];
      auto& mapped = peer_pieces_[static_cast<std::size_t>(r)];
      for (auto it = mapped.begin(); it != mapped.end();) {
        auto listed_now = now.find(it->second.id);
        if (listed_now != now.end() && listed_now->second.offset == it->second.offset &&
            listed_now->second.size == it->second.size) {
          ++it;
          continue;
        }
        std::lock_guard<std::mutex> lock(peers_mutex_);
        unmap_peer(r, it->second);
        it = mapped.erase(it);
      }
    }
    release_retired_peer_segments();
    for (int r = 0; r < world_; ++r) {
      if (r == rank_ || !listed[static_cast<std::size_t>(r)]) continue;
      const auto& mapped = peer_pieces_[static_cast<std::size_t>(r)];
      for (auto& [id, piece] : pieces[static_cast<std::size_t>(r)]) {
        auto it = mapped.lower_bound(piece.offset);
        if (it != mapped.end() && it->second.id == id) continue;
        // Two of one peer's segments may not overlap.
        const bool clash =
            (it != mapped.end() && it->first < piece.offset + piece.size) ||
            (it != mapped.begin() && std::prev(it)->first + std::prev(it)->second.size > piece.offset);
        if (clash)
          throw divergence_error("symmetric heap '" + group_ + "': rank " + std::to_string(r) +
                                 " published overlapping segments at offset " + std::to_string(piece.offset));
        map_peer_naming_it(r, piece);
      }
    }
  } catch (const std::exception& e) {
    failure = std::current_exception();
    why = e.what();
    if (why.empty()) why = "an error without a message";
    std::replace(why.begin(), why.end(), '\n', ' ');
  }
  if (failure) {
    post("synced", why.substr(0, 1024));
    std::rethrow_exception(failure);
  }
  // Nobody releases what a peer is still importing.
  const std::vector<std::string> verdicts = exchange("synced", "");
  for (int r = 0; r < world_; ++r)
    if (!verdicts[static_cast<std::size_t>(r)].empty())
      throw std::runtime_error(
          "symmetric heap '" + group_ + "': rank " + std::to_string(r) +
          " could not map its peers' segments: " + verdicts[static_cast<std::size_t>(r)]);
  // Every rank has mapped what every other published: now it counts.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (listed[static_cast<std::size_t>(rank_)]) synced_generation_ = generation;
  }
  tell_symmetric_observer();
}

std::vector<SymmetricSegment> SymmetricHeap::symmetric_segments() const {
  // One lock at a time: peer_ptr holds peers_mutex_ while it asks the
  // allocator, whose observer calls take mutex_ under the allocator's lock.
  std::vector<Piece> published;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const std::uint64_t id : published_)
      if (auto it = local_.find(id); it != local_.end()) published.push_back(it->second);
  }
  std::vector<SymmetricSegment> segments;
  std::lock_guard<std::mutex> peers_lock(peers_mutex_);
  for (const Piece& mine : published) {
    bool everywhere = true;
    for (int r = 0; r < world_ && everywhere; ++r) {
      if (r == rank_) continue;
      const auto& theirs = peer_pieces_[static_cast<std::size_t>(r)];
      auto at = theirs.find(mine.offset);
      everywhere = at != theirs.end() && at->second.size == mine.size;
    }
    if (everywhere)
      segments.push_back(
          {reinterpret_cast<void*>(allocator_.va_base() + mine.offset), mine.offset, mine.size});
  }
  std::sort(segments.begin(), segments.end(),
            [](const SymmetricSegment& a, const SymmetricSegment& b) { return a.offset < b.offset; });
  return segments;
}

void SymmetricHeap::tell_symmetric_observer() {
  if (!symmetric_observer_) return;
  std::vector<SymmetricSegment> now = symmetric_segments();
  if (now == told_) return;  // the same list on every rank, and what each last heard
  // Every rank tells its observer now, or none does: inside a graph capture
  // (device waits forbidden) NCCL's registration would end the capture.
  const bool ready = !device_waits_forbidden_.load();
  const std::vector<std::string> all = exchange("symmetric segments", ready ? "ready" : "deferred");
  if (std::find(all.begin(), all.end(), "deferred") != all.end()) return;
  symmetric_observer_->on_symmetric_segments(now);
  told_ = std::move(now);
}

}  // namespace symmpool
