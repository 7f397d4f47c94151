#include <symmpool/detail/format.hpp>
#include <symmpool/environment.hpp>
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

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find(' ', start), text.size());
    if (end > start) words.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return words;
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
  const Environment env = Environment::from_process();
  auto all = exchange("hello", node_identity(env) + " " + std::to_string(allocator_.va_reserved_bytes()) +
                                   " " + gpu + " " + server_->name() + " " + server_->secret() + " " +
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
    SYMMPOOL_EXPECTS(first_on_gpu || env.test_ranks_share_gpu,
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

// Called by sync(), holding mutex_, with the list it publishes: local_.
void SymmetricHeap::mark_published() {
  published_.clear();
  for (const auto& entry : local_) published_.insert(entry.first);
}

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

template <typename F>
auto SymmetricHeap::collective(const char* what, F&& step) -> decltype(step()) {
  require_sound();
  try {
    return step();
  } catch (const not_symmetric_error&) {
    throw;  // a verdict every rank shares, not a failure
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_.empty())
      failure_ = "symmetric heap '" + group_ + "' rank " + std::to_string(rank_) + " of " +
                 std::to_string(world_) + " failed in " + what + ": " + e.what();
    throw;
  }
}

void SymmetricHeap::require_sound() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty()) throw collective_error(failure_ + " (the heap is unusable since)");
}

std::string SymmetricHeap::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

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
std::string SymmetricHeap::list_for_sync(std::uint64_t* generation) {
  return allocator_.with_lock([&] {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string mine;
    for (auto& [id, p] : local_)
      mine += std::to_string(p.id) + " " + std::to_string(p.offset) + " " + std::to_string(p.size) + "\n";
    *generation = local_generation_;
    mark_published();
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

void SymmetricHeap::require_same_setting(const std::string& name, const std::string& value) {
  SYMMPOOL_EXPECTS(name.find('\n') == std::string::npos && value.find('\n') == std::string::npos,
                   "symmetric heap '" + group_ + "': a setting's name and value must be one line");
  collective("require_same_setting", [&] {
    const auto all = exchange("setting " + name, value);
    for (int r = 0; r < world_; ++r)
      if (all[static_cast<std::size_t>(r)] != value)
        throw logic_error("symmetric heap '" + group_ + "': " + name + " is '" +
                          all[static_cast<std::size_t>(r)] + "' on rank " + std::to_string(r) + " but '" +
                          value + "' on rank " + std::to_string(rank_) + ": every rank must set it alike");
  });
}

void SymmetricHeap::check_same_call(const std::string& call) {
  SYMMPOOL_EXPECTS(call.find('\n') == std::string::npos,
                   "symmetric heap '" + group_ + "': a call's label must be one line");
  collective("check_same_call", [&] { exchange("call " + call, ""); });
}

void SymmetricHeap::check_symmetric(const void* local, std::size_t bytes, const std::string& what) {
  bool synced = false;
  check_symmetric_and_sync(local, bytes, what, /*sync_if_needed=*/false, &synced);
}

// Each rank sends "<offset> <bytes>" (or "outside <bytes>"), and, when
// asked and its segments changed since the last sync, "sync" and its
// listing on the lines after: so ranks that reach the same check agree on
// a sync whichever of them needs it, instead of one syncing alone.
void SymmetricHeap::check_symmetric_and_sync(const void* local, std::size_t bytes, const std::string& what,
                                             bool sync_if_needed, bool* synced, Extent extent) {
  // Exchanged values are "<what>\n<data>": a newline in the label would make
  // every rank look diverged and break the heap for good.
  SYMMPOOL_EXPECTS(what.find('\n') == std::string::npos,
                   "symmetric heap '" + group_ + "': the buffer label of check_symmetric has a newline");
  std::string mine = std::to_string(bytes);
  if (!allocator_.owns(local))
    mine = "outside " + mine;
  else if (extent == Extent::kOneLiveAllocation && !allocator_.live_allocation(local, bytes))
    mine = "unallocated " + mine;
  else
    mine = std::to_string(offset_of(local)) + " " + mine;
  std::uint64_t generation = 0;
  *synced = false;
  std::vector<std::string> verdicts(static_cast<std::size_t>(world_));
  collective("check_symmetric", [&] {
    if (sync_if_needed && needs_sync()) mine += "\nsync\n" + list_for_sync(&generation);
    auto all = exchange("check " + what, mine);  // ranks checking different buffers fail here
    std::vector<std::string> listings(all.size());
    std::vector<bool> listed(all.size(), false);
    for (std::size_t r = 0; r < all.size(); ++r) {
      const std::size_t newline = all[r].find('\n');
      verdicts[r] = all[r].substr(0, newline);
      if (newline != std::string::npos) {
        const std::string rest = all[r].substr(newline + 1);
        if (rest.rfind("sync\n", 0) != 0)
          throw divergence_error("symmetric heap '" + group_ + "': rank " + std::to_string(r) +
                                 " sent a malformed check");
        listings[r] = rest.substr(5);
        listed[r] = true;
      }
    }
    if (std::find(listed.begin(), listed.end(), true) != listed.end()) {
      apply_listings(listings, listed, generation);
      *synced = true;
    }
  });
  std::string report;
  for (int r = 0; r < world_; ++r)
    if (verdicts[static_cast<std::size_t>(r)] != verdicts[0])
      report += "; rank " + std::to_string(r) + " has (offset size) " +
                verdicts[static_cast<std::size_t>(r)] + " where rank 0 has " + verdicts[0];
  for (int r = 0; r < world_; ++r)
    if (verdicts[static_cast<std::size_t>(r)].rfind("outside", 0) == 0)
      report += "; rank " + std::to_string(r) + "'s buffer is not in the symmetric heap";
    else if (verdicts[static_cast<std::size_t>(r)].rfind("unallocated", 0) == 0)
      report += "; rank " + std::to_string(r) +
                "'s buffer is not inside one live allocation (freed, or spanning two)";
  if (!report.empty()) throw not_symmetric_error("buffer '" + what + "' is not symmetric" + report);
}

std::size_t SymmetricHeap::mapped_peer_segments() const {
  std::lock_guard<std::mutex> lock(peers_mutex_);
  std::size_t n = 0;
  for (auto& m : peer_pieces_) n += m.size();
  return n;
}

}  // namespace symmpool
