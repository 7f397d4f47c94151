// SymmetricHeap's mappings of the peers' segments: made from the file
// descriptors the peers send, named in errors, released when retired, and
// the peer addresses and views they give.

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

void SymmetricHeap::map_peer(int peer, const Piece& piece) {
  // A view that still holds the peer's earlier segment there (see peer_view)
  // keeps its range mapped: refused before anything is fetched.
  {
    std::lock_guard<std::mutex> lock(peers_mutex_);
    auto& lingering = lingering_[static_cast<std::size_t>(peer)];
    lingering.erase(
        std::remove_if(lingering.begin(), lingering.end(), [](const auto& w) { return w.expired(); }),
        lingering.end());
    for (const auto& weak : lingering) {
      const auto held = weak.lock();
      if (held && piece.offset < held->offset() + held->size() && held->offset() < piece.offset + piece.size)
        throw logic_error("a view of its earlier segment at offsets [" + std::to_string(held->offset()) +
                          ", " + std::to_string(held->offset() + held->size()) +
                          ") is still alive (symmpool.peer_tensor of a buffer since freed): drop such views "
                          "before the memory is allocated again");
    }
  }
  SYMMPOOL_EXPECTS(
      !retired_peer_mapping_overlaps(peer_ranges_[static_cast<std::size_t>(peer)].get(), piece.offset,
                                     piece.size),
      "its earlier segment there is still mapped: it is unmapped only after a wait for the device, "
      "never during a CUDA graph capture (or the wait failed)");
  int fd = fetch_fd(peer_socket_[static_cast<std::size_t>(peer)], peer_pid_[static_cast<std::size_t>(peer)],
                    peer_secret_[static_cast<std::size_t>(peer)], piece.id, options_.timeout,
                    IfNobodyListens::kPeerGone);  // its server was up before its hello
  Piece mapped = piece;
  CUresult r = drv_.cuMemImportFromShareableHandle(&mapped.handle,
                                                   reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  ::close(fd);
  if (r != CUDA_SUCCESS)
    detail::throw_cuda_error(__FILE__, __LINE__, "cuMemImportFromShareableHandle", r, drv_.error_string(r));
  mapped.mapping = std::make_shared<PeerMapping>(drv_, allocator_.context(), allocator_.device(),
                                                 peer_ranges_[static_cast<std::size_t>(peer)], piece.offset,
                                                 piece.size, mapped.handle);
  std::lock_guard<std::mutex> lock(peers_mutex_);
  peer_pieces_[static_cast<std::size_t>(peer)][piece.offset] = mapped;
}

// map_peer, its errors prefixed with the heap, this rank, the peer and the
// segment (the channel's and the driver's own texts name none of them).
// Timeouts and driver errors keep their type; the channel's refusals (another
// process on the socket, an id the peer does not serve) are not bad input
// from the caller, so they become runtime errors: the communicator fails.
void SymmetricHeap::map_peer_naming_it(int peer, const Piece& piece) {
  const auto context = [&] {
    return "symmetric heap '" + group_ + "' rank " + std::to_string(rank_) + ": mapping rank " +
           std::to_string(peer) + "'s segment " + std::to_string(piece.id) + " (offset " +
           std::to_string(piece.offset) + ", " + std::to_string(piece.size) + " bytes): ";
  };
  try {
    map_peer(peer, piece);
  } catch (const timeout_error& e) {
    throw timeout_error(context() + e.what());
  } catch (const cuda_error& e) {
    throw cuda_error(context() + e.what(), e.code());
  } catch (const std::exception& e) {  // logic_error and runtime_error from the channel
    throw std::runtime_error(context() + e.what());
  }
}

void SymmetricHeap::unmap_peer(int peer, Piece& piece) noexcept {
  if (piece.mapping.use_count() > 1) lingering_[static_cast<std::size_t>(peer)].push_back(piece.mapping);
  piece.mapping.reset();  // unmapped here unless a view still holds it
}

// Our kernels and copies queued before now may still read or write a peer
// segment whose mapping retired (its owner released it, or a view of it
// went): the device finishes first. Not inside a graph capture, where a
// wait would invalidate it, nor where the wait fails: those stay mapped
// until a later sync (a new segment over them is refused, naming why).
void SymmetricHeap::release_retired_peer_segments() {
  if (device_waits_forbidden_.load() || retired_peer_mappings(allocator_.context()) == 0) return;
  const std::uint64_t retired_before = retired_peer_mapping_sequence();
  if (CUresult r = drv_.cuCtxSynchronize(); r != CUDA_SUCCESS) {
    SYMMPOOL_WARN(kHeap,
                  "heap '%s' rank %d keeps released peer segments mapped for now: waiting for the device "
                  "failed: %s",
                  group_.c_str(), rank_, drv_.error_string(r));
    return;
  }
  release_retired_peer_mappings(drv_, allocator_.context(), retired_before);
}

bool SymmetricHeap::contains(const void* local) const { return allocator_.owns(local); }

// Under peers_mutex_.
const SymmetricHeap::Piece& SymmetricHeap::peer_piece(const void* local, int peer, std::size_t bytes) const {
  const std::size_t offset = offset_of(local);
  const auto& mapped = peer_pieces_[static_cast<std::size_t>(peer)];
  auto it = mapped.upper_bound(offset);
  const std::size_t end = offset + std::max<std::size_t>(bytes, 1);
  SYMMPOOL_EXPECTS(it != mapped.begin() && std::prev(it)->second.offset + std::prev(it)->second.size >= end,
                   "rank " + std::to_string(peer) + " has no segment holding offsets [" +
                       std::to_string(offset) + ", " + std::to_string(end) + ") mapped on rank " +
                       std::to_string(rank_) + " (call sync() after allocating, on every rank)");
  return std::prev(it)->second;
}

void* SymmetricHeap::peer_ptr(const void* local, int peer, std::size_t bytes) const {
  require_sound();
  SYMMPOOL_EXPECTS(peer >= 0 && peer < world_, "peer " + std::to_string(peer) + " is not in the group");
  if (peer == rank_) return const_cast<void*>(local);
  std::lock_guard<std::mutex> lock(peers_mutex_);
  peer_piece(local, peer, bytes);
  return reinterpret_cast<void*>(peer_base_[static_cast<std::size_t>(peer)] + offset_of(local));
}

std::pair<void*, std::shared_ptr<void>> SymmetricHeap::peer_view(const void* local, int peer,
                                                                 std::size_t bytes) const {
  require_sound();
  SYMMPOOL_EXPECTS(peer >= 0 && peer < world_, "peer " + std::to_string(peer) + " is not in the group");
  if (peer == rank_) return {const_cast<void*>(local), nullptr};
  std::lock_guard<std::mutex> lock(peers_mutex_);
  const Piece& piece = peer_piece(local, peer, bytes);
  return {reinterpret_cast<void*>(peer_base_[static_cast<std::size_t>(peer)] + offset_of(local)),
          piece.mapping};
}

std::size_t SymmetricHeap::mapped_peer_segments() const {
  std::lock_guard<std::mutex> lock(peers_mutex_);
  std::size_t n = 0;
  for (auto& m : peer_pieces_) n += m.size();
  return n;
}

}  // namespace symmpool
