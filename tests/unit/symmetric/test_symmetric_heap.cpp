// The symmetric heap across real processes, on the fake driver: descriptors
// really cross Unix sockets and the fake's memfd-backed "device memory" is
// really shared, so a rank reads what its peer wrote.

#include "fake_fixture.hpp"
#include "fake_rank.hpp"
#include "process_group.hpp"
#include "rank_checks.hpp"

#include <symmpool/error.hpp>
#include <symmpool/symmetric_heap.hpp>

#include <dirent.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace symmpool::test {

namespace {

// Forms `group`'s heap on fake GPU `device`, expecting it to fail with E
// whose message contains `expected`; 0 when it did, 1 (reported) otherwise.
template <typename E>
int expect_heap_refused(int rank, int world, int device, const std::string& dir, const char* group,
                        std::chrono::milliseconds timeout, const std::string& expected) {
  auto alloc = fake_allocator(device);
  FileStore store(dir);
  try {
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, group, rank, world, HeapOptions{timeout});
    RANK_CHECK(false, "heap '%s' formed", group);
  } catch (const E& e) {
    RANK_CHECK(std::strstr(e.what(), expected.c_str()), "%s", e.what());
  }
  return 0;
}

// A store whose server is gone: writes vanish, every read fails as
// C10dStore fails when torch's TCPStore is unreachable.
class GoneStore final : public Store {
 public:
  void set(const std::string&, const std::string&) override {}
  std::string get(const std::string& key, std::chrono::milliseconds) override {
    throw store_error("the store failed while waiting for key '" + key + "'");
  }
  void erase(const std::string&) override {}
  bool contains(const std::string&) override { return false; }
};

}  // namespace

TEST(SymmetricHeapFake, RanksReadEachOthersBuffersAndReleasesPropagate) {
  const TempStoreDir store_dir;  // removed when the test ends, after its ranks
  const std::string& dir = store_dir.path();
  for (int world : {2, 3}) {
    const std::string group = "read" + std::to_string(world);
    std::string result = run_ranks(world, 60, [&](int rank, int w, Rendezvous&) {
      auto alloc = fake_allocator(rank);
      FileStore store(dir);
      SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, group, rank, w,
                         HeapOptions{std::chrono::seconds(20)});
      auto* a = static_cast<std::uint32_t*>(alloc->allocate(1000 * 4, stream(1)));
      void* big = alloc->allocate(30 * MiB, stream(1));
      for (std::uint32_t i = 0; i < 1000; ++i) a[i] = static_cast<std::uint32_t>(rank) * 100000u + i;
      heap.sync();
      RANK_CHECK(heap.mapped_peer_segments() == 2u * static_cast<std::size_t>(w - 1), "%zu",
                 heap.mapped_peer_segments());
      for (int peer = 0; peer < w; ++peer) {
        auto* pa = static_cast<const std::uint32_t*>(heap.peer_ptr(a, peer));
        for (std::uint32_t i = 0; i < 1000; ++i)
          RANK_CHECK(pa[i] == static_cast<std::uint32_t>(peer) * 100000u + i, "peer %d [%u] = %u", peer, i,
                     pa[i]);
      }
      // Writes through the peer mapping land in the peer's memory (once
      // everyone has finished reading: check_symmetric is also a barrier).
      heap.check_symmetric(a, 4000, "a");
      static_cast<std::uint32_t*>(heap.peer_ptr(a, (rank + 1) % w))[999] = 7u;
      heap.check_symmetric(a, 4000, "a");
      RANK_CHECK(a[999] == 7u, "%u", a[999]);

      alloc->deallocate(big, stream(1));
      // One rank's empty_cache keeps what peers map: no rank needs a sync
      // the others do not make.
      RANK_CHECK(alloc->empty_cache() == 0, "a published segment was released by one rank alone");
      RANK_CHECK(!heap.needs_sync(), "empty_cache made rank %d need a sync alone", rank);
      // Releasing is collective, and peers unmap what was released.
      RANK_CHECK(heap.release_cached() == 30 * MiB, "released a different amount");
      RANK_CHECK(heap.mapped_peer_segments() == static_cast<std::size_t>(w - 1), "%zu",
                 heap.mapped_peer_segments());
      alloc->deallocate(a, stream(1));
      return 0;
    });
    EXPECT_EQ(result, "") << "world " << world;
  }
}

// A rank that releases nothing of its own still unmaps what a peer released:
// its kernels queued before may still use that mapping, so the device must
// finish first (before this test, only a rank with segments of its own to
// release synchronized).
TEST(SymmetricHeapFake, UnmappingAReleasedPeerSegmentWaitsForTheDevice) {
  TempStoreDir dir;
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    FileStore store(dir.path());
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "peer-unmap", rank, w,
                       HeapOptions{std::chrono::seconds(20)});
    void* kept = alloc->allocate(4096, stream(1));
    void* extra = alloc->allocate(30 * MiB, stream(1));  // published on both ranks
    heap.sync();
    if (rank == 1) alloc->deallocate(extra, stream(1));  // only rank 1 has something to release
    FakeDriver::instance().clear_calls();
    heap.release_cached();
    const std::vector<std::string> calls = FakeDriver::instance().calls();
    const std::size_t sync = index_of(calls, "cuCtxSynchronize"), unmap = index_of(calls, "cuMemUnmap");
    RANK_CHECK(unmap < calls.size(), "rank %d unmapped nothing", rank);
    RANK_CHECK(sync < unmap, "rank %d unmapped before the device finished", rank);
    if (rank == 0) alloc->deallocate(extra, stream(1));
    // Inside a capture (a captured collective's sync) the heap never waits:
    // what a peer released stays mapped until a later sync.
    void* more = alloc->allocate(40 * MiB, stream(1));
    heap.sync();
    alloc->deallocate(more, stream(1));
    FakeDriver::instance().clear_calls();
    {
      SymmetricHeap::DeviceWaitsForbidden no_waits(heap, true);
      heap.release_cached();  // its own segments: the allocator's unmaps
    }
    // Rank 0 released `extra` and `more` now, rank 1 only `more` (its
    // `extra` went above): each unmapped its own, none of its peer's.
    const std::size_t own = rank == 0 ? 2u : 1u, peers = rank == 0 ? 1u : 2u;
    RANK_CHECK(FakeDriver::instance().count("cuMemUnmap") == own,
               "rank %d unmapped a peer segment inside a capture", rank);
    heap.sync();  // outside: now they go
    RANK_CHECK(FakeDriver::instance().count("cuMemUnmap") == own + peers, "rank %d kept them", rank);
    alloc->deallocate(kept, stream(1));
    return 0;
  });
  EXPECT_EQ(result, "");
}

// A view of a peer's segment (symmpool.peer_tensor) holds its mapping: it
// stays readable after the peer releases the segment and after the heap is
// gone. While it lives the peer's next segment at those offsets is refused
// by name, and the other rank fails at once, naming this one, instead of
// waiting out its timeout. A view that goes unmaps nothing itself (its
// deleter may run in a capture); the next wait for the device does.
// Before, the release or the heap unmapped it under the view.
TEST(SymmetricHeapFake, APeerViewKeepsItsMappingUntilItGoes) {
  TempStoreDir dir;
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    FileStore store(dir.path());
    const int peer = 1 - rank;
    std::shared_ptr<void> lease;
    const volatile std::uint32_t* view = nullptr;
    {
      SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "lease", rank, w,
                         HeapOptions{std::chrono::seconds(20)});
      void* kept = alloc->allocate(4096, stream(1));
      auto* buf = static_cast<std::uint32_t*>(alloc->allocate(30 * MiB, stream(1)));
      buf[0] = 100u + static_cast<std::uint32_t>(rank);
      heap.sync();
      auto [address, held] = heap.peer_view(buf, peer, 4);
      RANK_CHECK(address == heap.peer_ptr(buf, peer, 4), "peer_view and peer_ptr disagree");
      view = static_cast<const std::uint32_t*>(address);
      lease = std::move(held);  // only the lease holds it from here
      RANK_CHECK(lease != nullptr, "no lease on rank %d's segment", peer);
      RANK_CHECK(heap.peer_view(buf, rank, 4).second == nullptr, "a lease on this rank's own memory");
      heap.check_symmetric(buf, 4, "buf");  // both have read their lease before the release
      if (rank == 1) lease.reset();         // only rank 0 keeps its view
      alloc->deallocate(buf, stream(1));
      RANK_CHECK(heap.release_cached() == 30 * MiB, "released a different amount");
      RANK_CHECK(heap.mapped_peer_segments() == 1u, "%zu", heap.mapped_peer_segments());
      if (rank == 0) RANK_CHECK(view[0] == 101u, "after the release: %u", view[0]);
      // The peers' next segments land at the same offset.
      void* again = alloc->allocate(30 * MiB, stream(1));
      const auto start = std::chrono::steady_clock::now();
      try {
        heap.sync();
        RANK_CHECK(false, "rank %d synced over a live view", rank);
      } catch (const std::exception& e) {
        const char* expected = rank == 0 ? "is still alive (symmpool.peer_tensor" : "rank 0 could not map";
        RANK_CHECK(std::strstr(e.what(), expected) != nullptr, "%s", e.what());
      }
      RANK_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5), "rank %d waited", rank);
      // A failed heap stays up (its group holds it): rank 0 serves until rank 1 is done.
      if (rank == 1)
        store.set("lease-test-done", "1");
      else
        store.get("lease-test-done", std::chrono::seconds(20));
      alloc->deallocate(again, stream(1));
      alloc->deallocate(kept, stream(1));
    }
    const CUcontext context = alloc->context();
    if (rank == 1) {
      RANK_CHECK(retired_peer_mappings(context) == 0u, "rank 1 left %zu mapped",
                 retired_peer_mappings(context));
      return 0;
    }
    RANK_CHECK(view[0] == 101u, "after the heap: %u", view[0]);
    FakeDriver::instance().clear_calls();
    lease.reset();  // the last holder: retired, no driver call from a deleter
    RANK_CHECK(FakeDriver::instance().calls().empty(), "the view's deleter called the driver");
    RANK_CHECK(retired_peer_mappings(context) == 1u, "%zu", retired_peer_mappings(context));
    const std::uint64_t mark = retired_peer_mapping_sequence();  // then a wait for the device, in real use
    RANK_CHECK(release_retired_peer_mappings(FakeDriver::instance().api(), context, mark) == 1u,
               "nothing unmapped");
    RANK_CHECK(FakeDriver::instance().count("cuMemUnmap") == 1u, "not unmapped");
    RANK_CHECK(FakeDriver::instance().count("cuMemAddressFree") == 1u, "the range stayed");
    return 0;
  });
  EXPECT_EQ(result, "");
}

// One rank maps a segment the others do not (it allocated more): the next
// check of a new buffer carries its listing, so every rank syncs in the same
// exchange instead of that rank syncing alone (which diverged before).
TEST(SymmetricHeapFake, ASegmentOneRankMappedAloneIsSyncedAtTheNextCheck) {
  TempStoreDir dir;
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    FileStore store(dir.path());
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "alone", rank, w,
                       HeapOptions{std::chrono::seconds(20)});
    heap.sync();
    void* extra = rank == 1 ? alloc->allocate(30 * MiB, stream(1)) : nullptr;
    RANK_CHECK(heap.needs_sync() == (rank == 1), "needs_sync on rank %d", rank);
    void* a = alloc->allocate(4096, stream(1));
    bool synced = false;
    try {
      heap.check_symmetric_and_sync(a, 4096, "a", /*sync_if_needed=*/true, &synced);
    } catch (const not_symmetric_error&) {
      // rank 1's buffer may sit elsewhere: a verdict, and the sync happened all the same
    }
    RANK_CHECK(synced, "rank %d did not take part in rank 1's sync", rank);
    RANK_CHECK(!heap.needs_sync(), "rank %d still needs a sync", rank);
    RANK_CHECK(heap.mapped_peer_segments() == (rank == 0 ? 2u : 1u), "%zu", heap.mapped_peer_segments());
    alloc->deallocate(a, stream(1));
    if (extra) alloc->deallocate(extra, stream(1));
    return 0;
  });
  EXPECT_EQ(result, "");
}

// A retiring segment (outgrown, unmapped once its stream's work is done) is
// left out of a sync's listing: a rank whose GPU is slower would otherwise
// publish it, keep it for its peers and serve later requests from it, where
// a faster rank had unmapped it. Rank 1 plays the slower one. Before, rank 0
// mapped 3 of rank 1's segments and rank 1 never unmapped the outgrown one.
TEST(SymmetricHeapFake, ARetiringSegmentIsNotPublished) {
  TempStoreDir dir;
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    FileStore store(dir.path());
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "retiring", rank, w,
                       HeapOptions{std::chrono::seconds(20)});
    void* kept = alloc->allocate(4096, stream(1));
    alloc->deallocate(alloc->allocate(30 * MiB, stream(1)), stream(1));
    FakeDriver::instance().hold_events(rank == 1);
    void* grown = alloc->allocate(50 * MiB, stream(1));  // retires the 30 MiB one: rank 0 unmaps it now
    heap.sync();
    RANK_CHECK(heap.mapped_peer_segments() == 2u, "rank %d maps %zu of its peer's segments", rank,
               heap.mapped_peer_segments());
    FakeDriver::instance().complete_events();
    FakeDriver::instance().hold_events(false);
    void* later = alloc->allocate(4096, stream(1));  // any allocation finishes what is done
    RANK_CHECK(alloc->stats().segment_unmaps == 1u, "rank %d unmapped %llu segments", rank,
               static_cast<unsigned long long>(alloc->stats().segment_unmaps));
    for (void* p : {kept, grown, later}) alloc->deallocate(p, stream(1));
    return 0;
  });
  EXPECT_EQ(result, "");
}

// A sync on another thread lists this rank's segments while empty_cache
// waits for the device between finding a segment unpublished and unmapping
// it. The listing waits for the allocator's lock, so the segment is never
// published. Before, it was listed and then unmapped under the peers, who
// asked for a segment already gone and failed the heap on every rank.
TEST(SymmetricHeapFake, ASegmentBeingUnmappedIsNeverPublished) {
  TempStoreDir dir;
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    FileStore store(dir.path());
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "unmap-race", rank, w,
                       HeapOptions{std::chrono::seconds(20)});
    void* kept = alloc->allocate(4096, stream(1));
    heap.sync();
    if (rank == 0) {
      alloc->deallocate(alloc->allocate(30 * MiB, stream(1)), stream(1));  // mapped since: not published
      std::thread other;
      std::string failure;
      FakeDriver::instance().on_context_synchronize([&] {
        FakeDriver::instance().on_context_synchronize(nullptr);  // once
        other = std::thread([&] {
          try {
            heap.sync();
          } catch (const std::exception& e) {
            failure = e.what();
          }
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the listing's chance to run
      });
      RANK_CHECK(alloc->empty_cache() == 30 * MiB, "empty_cache released something else");
      other.join();
      RANK_CHECK(failure.empty(), "the other thread's sync failed: %s", failure.c_str());
    } else {
      heap.sync();
    }
    RANK_CHECK(heap.mapped_peer_segments() == 1u, "rank %d maps %zu peer segments", rank,
               heap.mapped_peer_segments());
    alloc->deallocate(kept, stream(1));
    return 0;
  });
  EXPECT_EQ(result, "");
}

// Ranks whose checks name different buffers (one rank ran a collective
// elsewhere, so its call numbers run ahead) fail at once with
// divergence_error naming both checks, instead of pairing two different calls.
TEST(SymmetricHeapFake, ChecksOfDifferentCallsFailAtOnceNamingBoth) {
  TempStoreDir dir;
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    FileStore store(dir.path());
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "calls", rank, w,
                       HeapOptions{std::chrono::seconds(20)});
    void* a = alloc->allocate(4096, stream(1));
    heap.sync();
    const auto start = std::chrono::steady_clock::now();
    try {
      heap.check_symmetric(a, 4096, rank == 0 ? "all_gather #5 output" : "all_gather #6 output");
      RANK_CHECK(false, "rank %d paired two different calls", rank);
    } catch (const divergence_error& e) {
      RANK_CHECK(
          std::strstr(e.what(), "all_gather #5 output") && std::strstr(e.what(), "all_gather #6 output"),
          "%s", e.what());
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    RANK_CHECK(waited < 5.0, "rank %d waited %.1f s for a divergence it could see at once", rank, waited);
    alloc->deallocate(a, stream(1));
    return 0;
  });
  EXPECT_EQ(result, "");
}

// Two ranks make a heap call alike (it passes), then one that differs
// between them (`step` names it): each rank raises Error at once, its text
// holding expected[rank], and the heap stays failed, naming `step`.
template <class Error>
std::string a_differing_step_fails_for_good(const char* heap_name, const char* step,
                                            const std::function<void(SymmetricHeap&, int rank)>& alike,
                                            const std::function<void(SymmetricHeap&, int rank)>& differing,
                                            const std::array<std::string, 2>& expected) {
  TempStoreDir dir;
  return run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    FileStore store(dir.path());
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, heap_name, rank, w,
                       HeapOptions{std::chrono::seconds(20)});
    alike(heap, rank);
    try {
      differing(heap, rank);
      RANK_CHECK(false, "rank %d went on past a %s that differs between ranks", rank, step);
    } catch (const Error& e) {
      const std::string text = e.what();
      RANK_CHECK(text.find(expected[static_cast<std::size_t>(rank)]) != std::string::npos, "%s",
                 text.c_str());
    }
    try {
      heap.sync();
      RANK_CHECK(false, "rank %d synced a failed heap", rank);
    } catch (const collective_error& e) {
      RANK_CHECK(std::strstr(e.what(), step), "%s", e.what());
    }
    return 0;
  });
}

// Settings that decide which algorithm runs must match on every rank:
// ranks that differ fail at once, each naming the setting and both values,
// and the heap stays failed.
TEST(SymmetricHeapFake, RanksWithDifferentSettingsFailAtOnceNamingBoth) {
  EXPECT_EQ(a_differing_step_fails_for_good<logic_error>(
                "settings", "require_same_setting",
                [](SymmetricHeap& heap, int) { heap.require_same_setting("the preference", "two-step"); },
                [](SymmetricHeap& heap, int rank) {
                  heap.require_same_setting("the preference", rank == 0 ? "two-shot" : "two-step");
                },
                {"the preference is 'two-step' on rank 1 but 'two-shot' on rank 0",
                 "the preference is 'two-shot' on rank 0 but 'two-step' on rank 1"}),
            "");
}

// Ranks at the same call pass check_same_call; ranks at different calls
// raise divergence_error, each naming both calls, and the heap stays failed.
TEST(SymmetricHeapFake, RanksAtDifferentCallsFailAtOnceNamingBoth) {
  EXPECT_EQ(
      a_differing_step_fails_for_good<divergence_error>(
          "calls", "check_same_call", [](SymmetricHeap& heap, int) { heap.check_same_call("all_reduce #2"); },
          [](SymmetricHeap& heap, int rank) {
            heap.check_same_call(rank == 0 ? "all_reduce #4" : "all_reduce #3");
          },
          {"rank 1 is at 'call all_reduce #3' where rank 0 is at 'call all_reduce #4'",
           "rank 0 is at 'call all_reduce #4' where rank 1 is at 'call all_reduce #3'"}),
      "");
}

// A rank killed in the middle of the group's work (here: between two heap
// exchanges) makes the survivors fail within the timeout, naming it, and
// the heap stays failed: no later call uses a mapping the ranks disagree on.
TEST(SymmetricHeapFake, ARankKilledMidwayFailsTheSurvivorsForGood) {
  TempStoreDir dir;
  constexpr auto kTimeout = std::chrono::seconds(2);
  std::string result = run_ranks(3, 60, [&](int rank, int w, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    FileStore store(dir.path());
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "killed", rank, w, HeapOptions{kTimeout});
    void* a = alloc->allocate(4096, stream(1));
    heap.sync();
    if (rank == 2) std::_Exit(0);  // killed: no destructor, no goodbye
    const auto start = std::chrono::steady_clock::now();
    try {
      heap.check_symmetric(a, 4096, "a");
      RANK_CHECK(false, "a check without rank 2 passed");
    } catch (const timeout_error& e) {
      RANK_CHECK(std::strstr(e.what(), "rank 2 never arrived"), "%s", e.what());
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    RANK_CHECK(waited < 2.0 + 1.0, "the survivor waited %.1f s", waited);
    for (int again = 0; again < 2; ++again) {
      try {
        heap.sync();
        RANK_CHECK(false, "a failed heap synced");
      } catch (const collective_error& e) {
        RANK_CHECK(std::strstr(e.what(), "rank 2 never arrived"), "%s", e.what());
      }
    }
    try {
      heap.peer_ptr(a, 1 - rank);
      RANK_CHECK(false, "a failed heap handed out a peer pointer");
    } catch (const collective_error&) {
    }
    alloc->deallocate(a, stream(1));
    return 0;
  });
  EXPECT_EQ(result, "");
}

TEST(SymmetricHeapFake, AsymmetricBuffersAreReportedWithRanksAndSizes) {
  const TempStoreDir store_dir;
  const std::string& dir = store_dir.path();
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    FileStore store(dir);
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "asym", rank, w,
                       HeapOptions{std::chrono::seconds(20)});
    const std::size_t bytes = rank == 0 ? 4096 : 8192;
    void* c = alloc->allocate(bytes, stream(1));
    try {
      heap.check_symmetric(c, bytes, "c");
      RANK_CHECK(false, "size mismatch went unnoticed");
    } catch (const logic_error& e) {
      RANK_CHECK(
          std::strstr(e.what(),
                      "buffer 'c' is not symmetric; rank 1 has (offset size) 0 8192 where rank 0 has 0 4096"),
          "%s", e.what());
    }
    int on_stack = 0;
    try {
      heap.check_symmetric(&on_stack, 4, "stack");
      RANK_CHECK(false, "a buffer outside the heap went unnoticed");
    } catch (const logic_error& e) {
      RANK_CHECK(std::strstr(e.what(), "is not in the symmetric heap"), "%s", e.what());
    }
    try {
      heap.peer_ptr(&on_stack, 1 - rank);
      RANK_CHECK(false, "peer_ptr of a foreign pointer");
    } catch (const logic_error&) {
    }
    // Rank 1 freed its buffer: symmetric offsets alone would pass, a check
    // that wants one live allocation names the rank on both.
    alloc->deallocate(c, stream(1));
    void* d = alloc->allocate(4096, stream(1));
    if (rank == 1) alloc->deallocate(d, stream(1));
    bool synced = false;
    try {
      heap.check_symmetric_and_sync(d, 4096, "d", /*sync_if_needed=*/true, &synced,
                                    SymmetricHeap::Extent::kOneLiveAllocation);
      RANK_CHECK(false, "a freed buffer went unnoticed");
    } catch (const not_symmetric_error& e) {
      RANK_CHECK(std::strstr(e.what(), "rank 1's buffer is not inside one live allocation"), "%s", e.what());
    }
    heap.check_symmetric(d, 4096, "d");  // offsets alone: still symmetric
    try {
      heap.check_symmetric(d, 4096, "d\nx");
      RANK_CHECK(false, "a label with a newline was exchanged");
    } catch (const logic_error& e) {
      RANK_CHECK(std::strstr(e.what(), "has a newline"), "%s", e.what());
    }
    RANK_CHECK(heap.failure().empty(), "a bad label broke the heap: %s", heap.failure().c_str());
    heap.check_symmetric(d, 4096, "d");
    if (rank == 0) alloc->deallocate(d, stream(1));
    return 0;
  });
  EXPECT_EQ(result, "");
}

TEST(SymmetricHeapFake, TwoRanksOnOneGpuAreRefusedByName) {
  const TempStoreDir store_dir;
  const std::string& dir = store_dir.path();
  std::string result = run_ranks(3, 60, [&](int rank, int w, Rendezvous&) {
    ::unsetenv("SYMMPOOL_TEST_RANKS_SHARE_GPU");  // the tests-only switch that allows it
    return expect_heap_refused<logic_error>(
        rank, w, rank == 2 ? 0 : rank, dir, "crowded", std::chrono::seconds(20),  // ranks 0 and 2 on GPU 0
        "ranks 0 and 2 both use the GPU at PCI 00000000:01:00.0; symmpool needs one GPU per rank");
  });
  EXPECT_EQ(result, "");
}

// A store that is gone is not a late rank: the heap says which wait the
// store failed in and calls no rank absent.
TEST(SymmetricHeapFake, AGoneStoreBlamesNoRank) {
  std::string result = run_ranks(1, 60, [&](int rank, int, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    GoneStore store;
    try {
      SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "gone", rank, 2,
                         HeapOptions{std::chrono::seconds(20)});
      RANK_CHECK(false, "a heap formed over a gone store");
    } catch (const store_error& e) {
      RANK_CHECK(std::strstr(e.what(), "rank 0: waiting for rank 1 at 'hello': the store failed"), "%s",
                 e.what());
      RANK_CHECK(!std::strstr(e.what(), "never arrived"), "%s", e.what());
    }
    return 0;
  });
  EXPECT_EQ(result, "");
}

// SYMMPOOL_TEST_RANKS_SHARE_GPU (tests only) lets ranks on one GPU form a
// heap and read each other's buffers: the 2-rank paths on a 1-GPU machine.
TEST(SymmetricHeapFake, RanksShareAGpuOnlyWhenTestsAskForIt) {
  const TempStoreDir store_dir;
  const std::string& dir = store_dir.path();
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    ::setenv("SYMMPOOL_TEST_RANKS_SHARE_GPU", "1", 1);
    auto alloc = fake_allocator(0);
    FileStore store(dir);
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "shared", rank, w,
                       HeapOptions{std::chrono::seconds(20)});
    auto* a = static_cast<std::uint32_t*>(alloc->allocate(64 * 4, stream(1)));
    for (std::uint32_t i = 0; i < 64; ++i) a[i] = static_cast<std::uint32_t>(rank) * 1000u + i;
    heap.sync();  // maps the peer's segment; collective: every rank has written
    const auto* pa = static_cast<const std::uint32_t*>(heap.peer_ptr(a, 1 - rank));
    RANK_CHECK(pa[63] == static_cast<std::uint32_t>(1 - rank) * 1000u + 63u, "peer [63] = %u", pa[63]);
    heap.check_symmetric(a, 64 * 4, "a");
    alloc->deallocate(a, stream(1));
    return 0;
  });
  EXPECT_EQ(result, "");
}

// SYMMPOOL_HOST_ID makes the two ranks look like two nodes: every rank
// throws multi_node_error (the "symm" backend then uses NCCL), naming both.
TEST(SymmetricHeapFake, RanksOnDifferentNodesAreToldApart) {
  const TempStoreDir store_dir;
  const std::string& dir = store_dir.path();
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    ::setenv("SYMMPOOL_HOST_ID", rank == 0 ? "node-a" : "node b", 1);  // spaces become '_'
    return expect_heap_refused<multi_node_error>(
        rank, w, 0, dir, "nodes", std::chrono::seconds(20),  // the same PCI address on both "nodes"
        "rank 1 is on node node_b and rank 0 on node node-a; a symmetric heap needs every rank on one node");
  });
  EXPECT_EQ(result, "");
}

// Rank 0 maps a segment rank 1 does not, so rank 0 syncs where rank 1 checks
// a buffer: both fail at once, naming both calls, instead of waiting out the
// timeout for a key the other never writes.
TEST(SymmetricHeapFake, RanksAtDifferentCollectivePointsFailAtOnce) {
  const TempStoreDir store_dir;
  const std::string& dir = store_dir.path();
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    FileStore store(dir);
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "diverge", rank, w,
                       HeapOptions{std::chrono::seconds(20)});
    void* a = alloc->allocate(4096, stream(1));
    heap.sync();
    void* extra = rank == 0 ? alloc->allocate(30 * MiB, stream(1)) : nullptr;
    const auto start = std::chrono::steady_clock::now();
    try {
      if (rank == 0)
        heap.sync();
      else
        heap.check_symmetric(a, 4096, "a");
      RANK_CHECK(false, "ranks at different collective points went on");
    } catch (const divergence_error& e) {
      RANK_CHECK(std::strstr(e.what(), rank == 0 ? "rank 1 is at 'check a' where rank 0 is at 'segments'"
                                                 : "rank 0 is at 'segments' where rank 1 is at 'check a'"),
                 "%s", e.what());
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    RANK_CHECK(waited < 5, "noticed after %.1f s", waited);
    if (extra) alloc->deallocate(extra, stream(1));
    alloc->deallocate(a, stream(1));
    return 0;
  });
  EXPECT_EQ(result, "");
}

// Each collective heap call publishes one key per rank; a rank erases its
// key of the round before, so a long run keeps at most two per rank.
TEST(SymmetricHeapFake, StoreKeysDoNotPileUp) {
  const TempStoreDir store_dir;
  const std::string& dir = store_dir.path();
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    FileStore store(dir);
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "keys", rank, w,
                       HeapOptions{std::chrono::seconds(20)});
    void* a = alloc->allocate(4096, stream(1));
    const std::uint64_t exchanges_before = heap_exchanges();
    for (int i = 0; i < 100; ++i) {
      heap.sync();
      heap.check_symmetric(a, 4096, "a");
    }
    // memory_stats()["heap_exchanges"]: every host round trip counts, two
    // per sync (the listings, then every rank's "synced"), one per check
    const std::uint64_t exchanges = heap_exchanges() - exchanges_before;
    RANK_CHECK(exchanges == 300, "%llu heap exchanges counted for 100 syncs and 100 checks",
               static_cast<unsigned long long>(exchanges));
    int keys = 0;
    if (DIR* d = ::opendir(dir.c_str())) {
      while (const dirent* e = ::readdir(d))
        keys += std::strstr(e->d_name, "%keys%0%round%") != nullptr;  // not the two "formed" marks
      ::closedir(d);
    }
    // Peers may be one round ahead or behind: 2 of ours, up to 3 of theirs.
    RANK_CHECK(keys <= 5, "%d store keys left after 201 heap calls", keys);
    alloc->deallocate(a, stream(1));
    return 0;
  });
  EXPECT_EQ(result, "");
}

// A group formed, destroyed and formed again on the same store (torch gives
// a re-created split group the same name and store prefix) uses fresh keys:
// a rank that forms it again alone waits for its peer instead of pairing
// with the hello the peer left before (which names a dead server).
TEST(SymmetricHeapFake, AGroupFormedAgainNeverReadsTheKeysOfTheFirst) {
  const TempStoreDir store_dir;
  const std::string& dir = store_dir.path();
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    FileStore store(dir);
    {  // formed and gone at once: its hellos (round 0) stay in the store
      SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "again", rank, w,
                         HeapOptions{std::chrono::seconds(20)});
    }
    if (rank == 1) return 0;  // leaves; only rank 0 forms the group again
    const auto start = std::chrono::steady_clock::now();
    try {
      SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "again", rank, w,
                         HeapOptions{std::chrono::milliseconds(500)});
      RANK_CHECK(false, "the heap formed again with a peer that left");
    } catch (const timeout_error& e) {
      RANK_CHECK(std::strstr(e.what(), "rank 1 never arrived at 'hello'"), "%s", e.what());
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    RANK_CHECK(waited >= 0.4, "gave up after %.2f s", waited);
    return 0;
  });
  EXPECT_EQ(result, "");
}

// A store that outlived its job (a FileStore directory used again by a new
// process) is refused by name instead of pairing with ranks that are gone.
TEST(SymmetricHeapFake, AStoreLeftByAnEarlierProcessIsRefused) {
  const TempStoreDir store_dir;
  const std::string& dir = store_dir.path();
  for (int job = 0; job < 2; ++job) {
    std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
      auto alloc = fake_allocator(rank);
      FileStore store(dir);
      try {
        SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "job", rank, w,
                           HeapOptions{std::chrono::seconds(20)});
        RANK_CHECK(job == 0, "the second job formed its heap on the first job's store");
      } catch (const logic_error& e) {
        RANK_CHECK(job == 1, "%s", e.what());
        RANK_CHECK(std::strstr(e.what(), "use a fresh store"), "%s", e.what());
      }
      return 0;
    });
    EXPECT_EQ(result, "") << "job " << job;
  }
}

// A peer segment that cannot be mapped fails the sync with an error that
// names the heap, this rank, the peer and the segment, not only the driver call.
TEST(SymmetricHeapFake, AFailedPeerMappingNamesThePeerAndTheSegment) {
  const TempStoreDir store_dir;
  const std::string& dir = store_dir.path();
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    FileStore store(dir);
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "mapfail", rank, w,
                       HeapOptions{std::chrono::seconds(2)});  // rank 1 waits out rank 0's failure
    void* a = alloc->allocate(4096, stream(1));
    if (rank == 0) FakeDriver::instance().fail("cuMemMap", CUDA_ERROR_OUT_OF_MEMORY);
    try {
      heap.sync();
      RANK_CHECK(rank == 1, "rank 0 mapped its peer's segment through a failing cuMemMap");
    } catch (const cuda_error& e) {
      RANK_CHECK(rank == 0, "%s", e.what());
      RANK_CHECK(std::strstr(e.what(), "symmetric heap 'mapfail' rank 0: mapping rank 1's segment") &&
                     std::strstr(e.what(), "2097152 bytes") && std::strstr(e.what(), "cuMemMap"),
                 "%s", e.what());
    } catch (const std::exception& e) {
      RANK_CHECK(rank == 1, "%s", e.what());  // rank 1 may see rank 0 leave the sync
    }
    alloc->deallocate(a, stream(1));
    return 0;
  });
  EXPECT_EQ(result, "");
}

TEST(SymmetricHeapFake, APeerThatNeverArrivesTimesOutWithItsRank) {
  const TempStoreDir store_dir;
  const std::string& dir = store_dir.path();
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    if (rank == 1) return 0;  // dies before joining
    return expect_heap_refused<timeout_error>(rank, w, rank, dir, "lonely", std::chrono::milliseconds(500),
                                              "rank 1 never arrived");
  });
  EXPECT_EQ(result, "");
}

}  // namespace symmpool::test
