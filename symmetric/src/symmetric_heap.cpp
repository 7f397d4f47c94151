#include "symmetric_heap_internal.hpp"

#include <symmpool/detail/format.hpp>
#include <symmpool/env_reader.hpp>
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

std::string SymmetricHeap::key(const std::string& what, int r) const {
  return "symmpool/" + group_ + "/" + std::to_string(instance_) + "/" + what + "/" + std::to_string(r);
}

namespace {

// How many heaps of `group` this process formed before. A group destroyed
// and formed again on the same store (torch gives a re-created split group
// the same name and store prefix) gets fresh keys: its ranks count alike, and
// none reads a key the earlier heap left (a stale hello names a dead server).
// Counted per name, so a group's ranks agree whatever other groups each of
// them formed: names must tell a process's groups apart (the torch backend
// names each heap after its process group).
int next_instance(const std::string& group) {
  static std::mutex mutex;
  static std::map<std::string, int> formed;
  std::lock_guard<std::mutex> lock(mutex);
  return formed[group]++;
}

std::atomic<std::uint64_t> exchanges_in_process{0};

}  // namespace

std::uint64_t heap_exchanges() { return exchanges_in_process.load(std::memory_order_relaxed); }

// Publishes `mine` for this round and returns every rank's value. Every
// exchange of a round shares one key, tagged with `what`, so ranks that reach
// different collective points (their allocations diverged) fail at once,
// naming both points, instead of each waiting for a key nobody writes.
std::vector<std::string> SymmetricHeap::exchange(const std::string& what, const std::string& mine) {
  const std::string name = "round/" + std::to_string(round_++);
  exchanges_in_process.fetch_add(1, std::memory_order_relaxed);
  store_.set(key(name, rank_), what + "\n" + mine);
  std::vector<std::string> all(static_cast<std::size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) {
      all[static_cast<std::size_t>(r)] = mine;
      continue;
    }
    std::string value;
    try {
      value = store_.get(key(name, r), options_.timeout);
    } catch (const timeout_error& e) {
      throw timeout_error("symmpool heap '" + group_ + "' rank " + std::to_string(rank_) + ": rank " +
                          std::to_string(r) + " never arrived at '" + what + "' (" + e.what() + ")");
    } catch (const store_error& e) {
      throw store_error("symmpool heap '" + group_ + "' rank " + std::to_string(rank_) +
                        ": waiting for rank " + std::to_string(r) + " at '" + what + "': " + e.what());
    }
    const std::size_t newline = value.find('\n');
    const std::string theirs = value.substr(0, newline);
    // Not a logic_error: callers that take a failed check_symmetric as
    // "use NCCL" must not swallow it.
    if (theirs != what)
      throw divergence_error("symmetric heap '" + group_ + "': rank " + std::to_string(r) + " is at '" +
                             theirs + "' where rank " + std::to_string(rank_) + " is at '" + what +
                             "' (heap call " + std::to_string(round_ - 1) +
                             "): the ranks' allocations or collective calls differ");
    all[static_cast<std::size_t>(r)] = value.substr(newline + 1);
  }
  // Every peer wrote this round, so every peer has read the previous one:
  // our key of that round is no longer needed.
  if (round_ >= 2) store_.erase(key("round/" + std::to_string(round_ - 2), rank_));
  return all;
}

// This rank's value of the next round, without waiting for the peers' (a
// rank that is leaving with an error tells them why).
void SymmetricHeap::post(const std::string& what, const std::string& mine) {
  const std::string name = "round/" + std::to_string(round_++);
  store_.set(key(name, rank_), what + "\n" + mine);
}

namespace {

// The GPU's PCI address, "domain:bus:device" as nvidia-smi prints it: the
// same on every process that uses that GPU, whatever CUDA_VISIBLE_DEVICES says.
std::string pci_address(const DriverApi& drv, int ordinal) {
  CUdevice dev = 0;
  SYMMPOOL_CU_TRY(drv, cuDeviceGet(&dev, ordinal));
  int domain = 0, bus = 0, device = 0;
  SYMMPOOL_CU_TRY(drv, cuDeviceGetAttribute(&domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, dev));
  SYMMPOOL_CU_TRY(drv, cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev));
  SYMMPOOL_CU_TRY(drv, cuDeviceGetAttribute(&device, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, dev));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%08x:%02x:%02x.0", domain, bus, device);
  return buf;
}

bool is_decimal(const std::string& text, std::size_t max_digits) {
  return !text.empty() && text.size() <= max_digits &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "" when a split hello's fields are well formed, else what is wrong. The
// socket, secret and pid are checked before use: they reach connect() and
// allow_pids().
std::string check_hello(const std::vector<std::string>& hello) {
  if (hello.size() != 6) return std::to_string(hello.size()) + " fields, not 6";
  if (!is_decimal(hello[1], 20)) return "the address space size is not a number";
  const std::string& socket = hello[3];
  const std::string prefix = "symmpool-";
  if (socket.size() > FdServer::kMaxNameChars || socket.rfind(prefix, 0) != 0 ||
      !is_hex_token(socket.substr(prefix.size()), FdServer::kMaxNameChars))
    return "the socket name is not symmpool-<hex>";
  if (hello[4].size() != FdServer::kSecretHexChars || !is_hex_token(hello[4], FdServer::kSecretHexChars))
    return "the secret is not " + std::to_string(FdServer::kSecretHexChars) + " hex characters";
  if (!is_decimal(hello[5], 9) || std::stol(hello[5]) <= 0) return "the pid is not a positive integer";
  return "";
}

}  // namespace

SymmetricHeap::SymmetricHeap(const DriverApi& drv, CachingAllocator& allocator, Store& store,
                             std::string group, int rank, int world, HeapOptions options)
    : drv_(drv),
      allocator_(allocator),
      store_(store),
      group_(std::move(group)),
      rank_(rank),
      world_(world),
      options_(options),
      instance_(next_instance(group_)) {
  SYMMPOOL_EXPECTS(world >= 1 && rank >= 0 && rank < world,
                   "rank " + std::to_string(rank) + " is not in a group of " + std::to_string(world));
  // A store that outlived an earlier process (a FileStore directory used
  // again) holds that process's keys under the same instance numbers: refuse
  // it rather than pair with ranks that are gone.
  const std::string formed = key("formed", rank_);
  SYMMPOOL_EXPECTS(
      !store_.contains(formed),
      "symmetric heap '" + group_ + "' rank " + std::to_string(rank_) + ": the store already holds " +
          "a heap of this group formed by this rank (another process, or this one before); use a " +
          "fresh store (directory) per job");
  store_.set(formed, std::to_string(::getpid()));
  // The server's name and secret are random; it serves nobody until
  // allow_pids() below names the peers.
  server_ = std::make_unique<FdServer>([this](std::uint64_t id) { return export_fd(id); });

  // (An iostream here once crashed inside a torch process: a private copy
  // of libstdc++, fixed in cmake/SharedLibstdcxx.cmake.)
  // "<node> <va bytes> <pci address> <socket> <secret> <pid>"; none has spaces.
  const std::string gpu = pci_address(drv_, allocator_.device());
  // SYMMPOOL_TEST_RANKS_SHARE_GPU=1: a heap accepts ranks on one GPU, which
  // it refuses otherwise (as NCCL does). Tests only: it runs the 2-rank
  // paths on a 1-GPU machine (tests/python/launch.py run_sharing_one_gpu).
  const bool ranks_may_share_gpu = env::is_true("SYMMPOOL_TEST_RANKS_SHARE_GPU");
  auto all = exchange("hello", node_identity() + " " + std::to_string(allocator_.va_reserved_bytes()) + " " +
                                   gpu + " " + server_->name() + " " + server_->secret() + " " +
                                   std::to_string(::getpid()));
  std::vector<std::vector<std::string>> hellos;
  std::vector<pid_t> peer_pids;
  peer_socket_.resize(static_cast<std::size_t>(world_));
  peer_secret_.resize(static_cast<std::size_t>(world_));
  peer_pid_.resize(static_cast<std::size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    hellos.push_back(split_words(all[static_cast<std::size_t>(r)]));
    // The hello carries a secret: name the bad field, never print the text.
    const std::string bad = check_hello(hellos.back());
    SYMMPOOL_EXPECTS(bad.empty(), "symmetric heap '" + group_ + "': rank " + std::to_string(r) +
                                      " sent a malformed hello: " + bad + " (another symmpool version?)");
    peer_socket_[static_cast<std::size_t>(r)] = hellos.back()[3];
    peer_secret_[static_cast<std::size_t>(r)] = hellos.back()[4];
    peer_pid_[static_cast<std::size_t>(r)] = static_cast<pid_t>(std::stol(hellos.back()[5]));
    if (r != rank_) peer_pids.push_back(peer_pid_[static_cast<std::size_t>(r)]);
    gpu_pci_.push_back(hellos.back()[2]);
  }
  server_->allow_pids(std::move(peer_pids));
  // Nodes first: PCI addresses repeat across nodes.
  for (int r = 1; r < world_; ++r)
    if (hellos[static_cast<std::size_t>(r)][0] != hellos[0][0])
      throw multi_node_error("symmetric heap '" + group_ + "': rank " + std::to_string(r) + " is on node " +
                             hellos[static_cast<std::size_t>(r)][0] + " and rank 0 on node " + hellos[0][0] +
                             "; a symmetric heap needs every rank on one node");
  std::map<std::string, int> rank_of_gpu;
  for (int r = 0; r < world_; ++r) {
    const std::vector<std::string>& hello = hellos[static_cast<std::size_t>(r)];
    const std::size_t va = std::strtoull(hello[1].c_str(), nullptr, 10);
    const std::string& peer_gpu = hello[2];
    // Like NCCL, one GPU per rank: two ranks on one GPU would import their
    // own memory through each other and NCCL's fallback path refuses them.
    const auto [it, first_on_gpu] = rank_of_gpu.emplace(peer_gpu, r);
    SYMMPOOL_EXPECTS(first_on_gpu || ranks_may_share_gpu,
                     "symmetric heap '" + group_ + "': ranks " + std::to_string(it->second) + " and " +
                         std::to_string(r) + " both use the GPU at PCI " + peer_gpu +
                         "; symmpool needs one GPU per rank");
    SYMMPOOL_EXPECTS(va == allocator_.va_reserved_bytes(),
                     "symmetric heap '" + group_ + "': rank " + std::to_string(r) + " reserved " +
                         std::to_string(va) + " bytes of address space, rank " + std::to_string(rank_) +
                         " reserved " + std::to_string(allocator_.va_reserved_bytes()) +
                         " (devices of different sizes cannot share a heap)");
  }
  peer_ranges_.resize(static_cast<std::size_t>(world_));
  peer_base_.assign(static_cast<std::size_t>(world_), 0);
  peer_pieces_.resize(static_cast<std::size_t>(world_));
  lingering_.resize(static_cast<std::size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    auto& range = peer_ranges_[static_cast<std::size_t>(r)];
    range =
        std::make_shared<PeerAddressRange>(drv_, allocator_.va_reserved_bytes(), allocator_.granularity());
    peer_base_[static_cast<std::size_t>(r)] = range->base();
  }
  allocator_.add_observer(this, /*replay_existing=*/true);
  observing_ = true;
}

SymmetricHeap::~SymmetricHeap() {
  if (observing_) allocator_.remove_observer(this, /*replay_existing=*/false);
  server_.reset();
  {
    std::lock_guard<std::mutex> lock(peers_mutex_);
    peer_pieces_.clear();  // each mapping retires unless a view still holds it
  }
  // Our communicator waited for the device before its heap went; wait again
  // (a user's kernel may read a peer's memory) and unmap what retired.
  try {
    ContextGuard guard(drv_, allocator_.context());
    release_retired_peer_segments();
  } catch (const std::exception& e) {
    SYMMPOOL_WARN(kHeap, "heap '%s' rank %d: %s", group_.c_str(), rank_, e.what());
  }
  // Each peer's range goes with its last mapping.
}

void SymmetricHeap::on_segment_mapped(const Segment& segment) {
  std::lock_guard<std::mutex> lock(mutex_);
  local_[segment.id] = Piece{segment.id, segment.offset, segment.size, segment.handle, nullptr};
  ++local_generation_;
}

void SymmetricHeap::on_segment_unmapping(const Segment& segment) noexcept {
  // Peers keep their mapping (their imported handle holds the memory) until
  // the next sync() tells them the segment is gone.
  std::lock_guard<std::mutex> lock(mutex_);
  local_.erase(segment.id);
  ++local_generation_;
}

bool SymmetricHeap::needs_sync() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return local_generation_ != synced_generation_;
}

std::uint64_t SymmetricHeap::releases() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return releases_;
}

int SymmetricHeap::export_fd(std::uint64_t id) {
  CUmemGenericAllocationHandle handle = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Only what sync() told the group about: nothing unpublished leaks out.
    auto it = local_.find(id);
    if (it == local_.end() || !published_.count(id)) return -1;
    handle = it->second.handle;
  }
  int fd = -1;
  if (drv_.cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) !=
      CUDA_SUCCESS)
    return -1;
  return fd;
}

void SymmetricHeap::require_sound() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty()) throw collective_error(failure_ + " (the heap is unusable since)");
}

std::string SymmetricHeap::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void SymmetricHeap::set_symmetric_observer(SymmetricSegmentObserver* observer) {
  told_.clear();
  symmetric_observer_ = observer;
  if (observer) collective("set_symmetric_observer", [&] { tell_symmetric_observer(); });
}

std::vector<std::string> SymmetricHeap::exchange_among_ranks(const std::string& what,
                                                             const std::string& mine) {
  SYMMPOOL_EXPECTS(what.find('\n') == std::string::npos,
                   "symmetric heap '" + group_ + "': an exchange's label must be one line");
  return collective("exchange_among_ranks", [&] { return exchange(what, mine); });
}

SymmetricHeap::DeviceWaitsForbidden::DeviceWaitsForbidden(SymmetricHeap& heap, bool forbid)
    : heap_(heap),
      before_(heap.device_waits_forbidden_.exchange(forbid || heap.device_waits_forbidden_.load())) {}

SymmetricHeap::DeviceWaitsForbidden::~DeviceWaitsForbidden() { heap_.device_waits_forbidden_.store(before_); }

void SymmetricHeap::sync() {
  collective("sync", [&] {
    std::uint64_t generation = 0;
    auto all = exchange("segments", list_for_sync(&generation));
    apply_listings(all, std::vector<bool>(static_cast<std::size_t>(world_), true), generation);
  });
}

std::size_t SymmetricHeap::release_cached() {
  const std::size_t released = collective("release_cached", [&] {
    exchange("release", "");                      // every rank is here: nobody uses a peer's segment now
    if (symmetric_observer_ && !told_.empty()) {  // the same on every rank
      // An observer's users (NCCL's kernels on its windows) finish first.
      {
        ContextGuard guard(drv_, allocator_.context());
        SYMMPOOL_CU_TRY(drv_, cuCtxSynchronize());
      }
      symmetric_observer_->on_segments_releasing();
      told_.clear();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      published_.clear();  // peers drop what we release at the sync below
      ++releases_;
    }
    return allocator_.empty_cache();
  });
  sync();
  return released;
}

bool SymmetricHeap::keeps_mapped(const Segment& segment) const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return published_.count(segment.id) != 0;
}

void* SymmetricHeap::allocate_internal() {
  return collective("allocate_internal", [&] {
    const std::uint64_t free_here = allocator_.free_internal_slots();
    auto all = exchange("internal", std::to_string(free_here));
    std::uint64_t free_everywhere = free_here;
    for (int r = 0; r < world_; ++r) {
      const std::string& theirs = all[static_cast<std::size_t>(r)];
      SYMMPOOL_EXPECTS(!theirs.empty() && theirs.size() <= 20 &&
                           theirs.find_first_not_of("0123456789") == std::string::npos,
                       "symmetric heap '" + group_ + "': rank " + std::to_string(r) +
                           " sent malformed internal slots '" + theirs + "'");
      free_everywhere &= std::strtoull(theirs.c_str(), nullptr, 10);
    }
    int slot = 0;
    while (slot < SegmentArena::kInternalSlots && !(free_everywhere >> slot & 1u)) ++slot;
    SYMMPOOL_EXPECTS(slot < SegmentArena::kInternalSlots,
                     "symmetric heap '" + group_ + "': no internal slot is free on every rank (" +
                         std::to_string(SegmentArena::kInternalSlots) + " per device; too many groups?)");
    return allocator_.map_internal_segment(slot);
  });
}

void SymmetricHeap::release_internal(void* ptr) { allocator_.unmap_internal_segment(ptr); }

std::size_t SymmetricHeap::offset_of(const void* local) const {
  const auto address = reinterpret_cast<CUdeviceptr>(local);
  const CUdeviceptr base = allocator_.va_base();
  SYMMPOOL_EXPECTS(
      address >= base && address < base + allocator_.va_reserved_bytes() && allocator_.owns(local),
      detail::format_pointer(local) + " is not in the symmetric heap of rank " + std::to_string(rank_));
  return address - base;
}

}  // namespace symmpool
