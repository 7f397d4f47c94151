#pragma once
// The symmetric heap of one device in one group of processes on a node.
// Every rank's segments sit at deterministic offsets of its reserved range;
// each rank reserves a range of the same size for every peer and maps the
// peers' segments there, so a peer's copy of a buffer is at
// peer_base[p] + offset. Peers import new segments lazily, at sync(), a
// collective point: metadata through the Store, descriptors over Unix sockets.
// Symmetry is checked, never assumed (check_symmetric).

#include <symmpool/caching_allocator.hpp>
#include <symmpool/error.hpp>
#include <symmpool/fd_channel.hpp>
#include <symmpool/peer_mapping.hpp>
#include <symmpool/store.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace symmpool {

struct HeapOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};  // for every wait on a peer
};

// A segment that every rank of a heap maps at the same offset with the same size.
struct SymmetricSegment {
  void* ptr = nullptr;  // this rank's
  std::size_t offset = 0;
  std::size_t size = 0;
  bool operator==(const SymmetricSegment& o) const {
    return ptr == o.ptr && offset == o.offset && size == o.size;
  }
};

// Hears, on every rank at the same points, which of a heap's segments are
// symmetric: what NCCL's symmetric windows need (nccl_windows.hpp).
class SymmetricSegmentObserver {
 public:
  virtual ~SymmetricSegmentObserver() = default;
  // Collective: when attached, and after each sync every rank completed that
  // changed them, the segments symmetric now, by offset: the same list on
  // every rank. Never inside an allocation, outside the allocator's and the
  // heap's locks; not while a graph capture forbids device waits (then at a
  // later sync). A throw breaks the heap, as any failed collective step.
  virtual void on_symmetric_segments(const std::vector<SymmetricSegment>& now) = 0;
  // On every rank, in release_cached, once the device has finished its
  // work and before any segment is unmapped. The next sync tells again
  // which segments are symmetric.
  virtual void on_segments_releasing() = 0;
};

// Host round trips every heap of this process made so far (each waits for
// every peer's host to reach the same point): a steady training step that
// keeps making them couples the ranks' hosts.
std::uint64_t heap_exchanges();

class SymmetricHeap final : public SegmentObserver {
 public:
  // Collective over the `world` ranks of `group`; throws timeout_error when a
  // peer never arrives, store_error when the store fails, multi_node_error
  // when the ranks are on different nodes and logic_error when their heaps
  // cannot match (two ranks on one GPU unless SYMMPOOL_TEST_RANKS_SHARE_GPU,
  // devices of different sizes), or when `store` already holds a heap
  // of `group` this rank formed (use a fresh store per job). `group` names
  // the heap among this process's heaps: forming a group again (after the
  // first is gone) uses fresh store keys on every rank that does so.
  SymmetricHeap(const DriverApi& drv, CachingAllocator& allocator, Store& store, std::string group, int rank,
                int world, HeapOptions options = {});
  ~SymmetricHeap() override;
  SymmetricHeap(const SymmetricHeap&) = delete;
  SymmetricHeap& operator=(const SymmetricHeap&) = delete;

  // Collective calls (sync, check_symmetric, allocate_internal) throw
  // divergence_error, naming both calls, when a peer made a different one at
  // the same point. A collective call that fails part-way (a peer never
  // came, the ranks diverged, a peer sent nonsense) leaves the heap broken:
  // every later collective call and peer_ptr throws collective_error with
  // the first failure, so nobody reads through a mapping peers disagree on.

  // Collective: every rank publishes its segments and maps the peers' new
  // ones (and unmaps the ones they released). Nothing is taken as synced
  // before every rank has mapped what the others published.
  void sync();

  // Collective: checks that `local` has the same offset and `bytes` on every
  // rank; throws not_symmetric_error naming the ranks and values otherwise.
  // `what` names the buffer and must be the same on every rank (ranks at
  // different checks raise divergence_error, naming both).
  void check_symmetric(const void* local, std::size_t bytes, const std::string& what);
  // The same check, and when `sync_if_needed` and any rank's segments
  // changed since its last sync (needs_sync), a sync in the same exchange,
  // so the ranks decide it together. `*synced`: whether a sync happened (on
  // every rank alike), set before not_symmetric_error is thrown. With
  // kOneLiveAllocation the bytes must also lie in one live allocation on
  // every rank (not freed, not spanning blocks).
  enum class Extent { kInHeap, kOneLiveAllocation };
  void check_symmetric_and_sync(const void* local, std::size_t bytes, const std::string& what,
                                bool sync_if_needed, bool* synced, Extent extent = Extent::kInHeap);

  // Collective: gives every cached segment no block uses back to the
  // driver on every rank (the allocator's empty_cache keeps the ones peers
  // map), then syncs so peers unmap them. Returns the bytes given back here.
  std::size_t release_cached();

  // Collective: every rank must hold the same `value` of the setting `name`
  // (settings that decide which algorithm runs: ranks that differ would
  // wait for each other in different places). Throws logic_error naming the
  // setting, the ranks and both values otherwise, which leaves the heap
  // broken as any failed collective call does.
  void require_same_setting(const std::string& name, const std::string& value);

  // Collective: every rank must be at the same `call` (a collective's name
  // and number, one line). Ranks at different calls raise divergence_error
  // naming both; a rank that never comes, timeout_error. For callers whose
  // call makes no other exchange that would show it.
  void check_same_call(const std::string& call);

  // Collective: one granule of device memory at the same offset on every
  // rank whatever the ranks allocated before (an internal slot free on all
  // of them), for symmpool's own state such as signal pads. Peers map it at
  // the next sync(). release_internal gives it back (local).
  void* allocate_internal();
  void release_internal(void* ptr);

  // Collective: from now on `observer` hears which segments are symmetric
  // (at once, then after syncs that change them); null detaches (local).
  // One at a time; it must outlive its attachment.
  void set_symmetric_observer(SymmetricSegmentObserver* observer);
  // Collective: every rank's `mine`, for an observer's own agreement. Ranks
  // at another point (`what` differs) raise divergence_error naming both.
  std::vector<std::string> exchange_among_ranks(const std::string& what, const std::string& mine);
  // Each rank's GPU, by PCI address ("domain:bus:device.0").
  const std::vector<std::string>& gpu_pci_addresses() const { return gpu_pci_; }

  // The first failure of a collective call, or empty while the heap is sound.
  std::string failure() const;

  // The address of `local`'s counterpart on `peer`, mapped here. Throws if
  // `local` is not in the heap or the peer's segment was not synced yet;
  // with `bytes`, also unless one mapped segment of the peer holds all of
  // [local, local + bytes).
  void* peer_ptr(const void* local, int peer, std::size_t bytes = 1) const;
  // peer_ptr's address, and what keeps that peer mapping alive (null for
  // this rank's own memory), found together: a view of it holds the latter,
  // so the view stays readable after the peer releases the segment or the
  // heap is gone. While such a view lives, the peer's next segment at those
  // offsets cannot be mapped (the sync that tries fails, naming the view).
  std::pair<void*, std::shared_ptr<void>> peer_view(const void* local, int peer, std::size_t bytes = 1) const;
  std::size_t offset_of(const void* local) const;
  bool contains(const void* local) const;

  // True when this rank mapped or unmapped a segment since its last sync():
  // peers may not see it yet.
  bool needs_sync() const;
  // release_cached() calls so far: the same on every rank. Only they unmap
  // segments peers map (the others were never published, so no verdict can
  // name them): a symmetry verdict taken before the count last moved may be
  // stale, one taken since holds whatever this rank mapped or unmapped alone.
  std::uint64_t releases() const;

  // While one lives, this heap never waits for the device (cuCtxSynchronize
  // would invalidate a CUDA graph capture under way): released peer
  // segments stay mapped until a later sync. Communicator holds one around
  // the heap calls of a captured collective.
  class DeviceWaitsForbidden {
   public:
    DeviceWaitsForbidden(SymmetricHeap& heap, bool forbid);
    ~DeviceWaitsForbidden();
    DeviceWaitsForbidden(const DeviceWaitsForbidden&) = delete;
    DeviceWaitsForbidden& operator=(const DeviceWaitsForbidden&) = delete;

   private:
    SymmetricHeap& heap_;
    bool before_;
  };

  int rank() const { return rank_; }
  int world() const { return world_; }
  std::size_t mapped_peer_segments() const;

  void on_segment_mapped(const Segment& segment) override;
  void on_segment_unmapping(const Segment& segment) noexcept override;
  // Published segments stay mapped while the heap lives (empty_cache, OOM
  // retry): peers map them, and only a collective decision could free them.
  bool keeps_mapped(const Segment& segment) const noexcept override;

 private:
  struct Piece {
    std::uint64_t id;
    std::size_t offset;
    std::size_t size;
    CUmemGenericAllocationHandle handle;
    std::shared_ptr<PeerMapping> mapping;  // peers' pieces only
  };
  std::string key(const std::string& what, int r) const;
  std::vector<std::string> exchange(const std::string& what, const std::string& mine);
  void post(const std::string& what, const std::string& mine);
  void release_retired_peer_segments();
  // Runs a collective step; a throw marks the heap broken (failure()).
  template <typename F>
  auto collective(const char* what, F&& step) -> decltype(step());
  void require_sound() const;
  std::map<std::uint64_t, Piece> parse_segments(int peer, const std::string& listing) const;
  std::string list_for_sync(std::uint64_t* generation);
  void apply_listings(const std::vector<std::string>& listings, const std::vector<bool>& listed,
                      std::uint64_t generation);
  void map_peer(int peer, const Piece& piece);
  void map_peer_naming_it(int peer, const Piece& piece);
  void unmap_peer(int peer, Piece& piece) noexcept;
  const Piece& peer_piece(const void* local, int peer, std::size_t bytes) const;
  int export_fd(std::uint64_t id);
  // Published segments every peer maps at the same offset and size, by offset.
  std::vector<SymmetricSegment> symmetric_segments() const;
  // Tells the observer the symmetric segments where they changed since it
  // last heard (the same decision on every rank). Inside a collective step.
  void tell_symmetric_observer();

  const DriverApi& drv_;
  CachingAllocator& allocator_;
  Store& store_;
  std::string group_;
  int rank_;
  int world_;
  HeapOptions options_;
  const int instance_;       // heaps of group_ this process formed before (in every key)
  std::uint64_t round_ = 0;  // collective calls so far: keys never repeat

  mutable std::mutex mutex_;                         // local_ (allocator and server threads)
  std::map<std::uint64_t, Piece> local_;             // by segment id
  std::set<std::uint64_t> published_;                // ids of local_ at the last sync(): all export_fd serves
  std::uint64_t local_generation_ = 0;               // bumped on every local map/unmap
  std::uint64_t releases_ = 0;                       // release_cached() calls so far
  std::uint64_t synced_generation_ = 0;              // local_generation_ at the last sync()
  std::string failure_;                              // first failure of a collective call (sticky)
  std::atomic<bool> device_waits_forbidden_{false};  // see DeviceWaitsForbidden
  mutable std::mutex peers_mutex_;  // peer_pieces_ and lingering_: views are made on any thread
  std::vector<std::shared_ptr<PeerAddressRange>> peer_ranges_;
  std::vector<CUdeviceptr> peer_base_;                     // peer_ranges_[r]->base()
  std::vector<std::map<std::size_t, Piece>> peer_pieces_;  // by offset
  // Mappings of released peer segments that views still hold, per peer.
  std::vector<std::vector<std::weak_ptr<PeerMapping>>> lingering_;
  std::vector<std::string> peer_socket_;
  std::vector<std::string> peer_secret_;  // each peer's FdServer secret
  std::vector<pid_t> peer_pid_;           // each peer's pid: its FdServer's, checked on fetch
  std::unique_ptr<FdServer> server_;
  bool observing_ = false;
  std::vector<std::string> gpu_pci_;  // each rank's, from the hellos
  // Called by the thread making collective calls only (as the heap's rounds).
  SymmetricSegmentObserver* symmetric_observer_ = nullptr;
  std::vector<SymmetricSegment> told_;  // what it last heard
};

}  // namespace symmpool
