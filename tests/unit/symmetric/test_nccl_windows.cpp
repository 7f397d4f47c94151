// NCCL windows over the symmetric heap, across real processes on the fake
// driver and a fake NCCL: which segments become windows and when, what goes
// before their memory, and what a refusing or absent rank does to the others.

#include "fake_fixture.hpp"
#include "fake_rank.hpp"
#include "process_group.hpp"
#include "rank_checks.hpp"

#include <symmpool/error.hpp>
#include <symmpool/nccl_windows.hpp>
#include <symmpool/store.hpp>
#include <symmpool/symmetric_heap.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

namespace symmpool::test {

namespace {

const ncclComm_t kComm = reinterpret_cast<ncclComm_t>(std::uintptr_t{1});

// Runs body(rank, allocator, heap) on 2 ranks, each with a heap of `group`.
std::string on_two_ranks(const std::string& group,
                         const std::function<int(int rank, CachingAllocator&, SymmetricHeap&)>& body) {
  const TempStoreDir store_dir;
  return run_ranks(2, 60, [&](int rank, int world, Rendezvous&) {
    auto alloc = fake_allocator(rank);
    FileStore store(store_dir.path());
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, group, rank, world,
                       HeapOptions{std::chrono::seconds(20)});
    return body(rank, *alloc, heap);
  });
}

}  // namespace

TEST(NcclWindowsFake, SymmetricSegmentsBecomeWindowsAtTheSyncAndGoBeforeTheirMemory) {
  const std::string result =
      on_two_ranks("windows", [](int rank, CachingAllocator& alloc, SymmetricHeap& heap) {
        FakeDriver& fake = FakeDriver::instance();
        void* a = alloc.allocate(4096, stream(1));
        heap.sync();
        NcclWindows windows(heap, kComm, fake.nccl(), std::chrono::seconds(5));
        RANK_CHECK(windows.counts().live == 1 && fake.count("ncclCommWindowRegister") == 1,
                   "%zu windows after attaching", windows.counts().live);
        RANK_CHECK(windows.covers(a, 4096), "a's segment is no window");
        // Rank 0 alone maps a segment: the next one lies elsewhere on each rank,
        // and neither is symmetric.
        void* only0 = rank == 0 ? alloc.allocate(30 * MiB, stream(1)) : nullptr;
        void* b = alloc.allocate(6 * MiB, stream(1));
        heap.sync();
        RANK_CHECK(windows.counts().live == 1 && windows.counts().registrations == 1, "%zu windows",
                   windows.counts().live);
        RANK_CHECK(!windows.covers(b, 6 * MiB), "b is in a window though its segment is not symmetric");
        alloc.deallocate(b, stream(1));
        if (only0) alloc.deallocate(only0, stream(1));
        alloc.deallocate(a, stream(1));
        fake.clear_calls();
        heap.release_cached();
        const std::vector<std::string> calls = fake.calls();
        const std::size_t drain = index_of(calls, "cuCtxSynchronize");
        const std::size_t dereg = index_of(calls, "ncclCommWindowDeregister");
        const std::size_t unmap = index_of(calls, "cuMemUnmap");
        RANK_CHECK(unmap < calls.size() && dereg < unmap,
                   "window deregistered at %zu, memory unmapped at %zu", dereg, unmap);
        RANK_CHECK(drain < dereg, "the window went before the device drained");
        RANK_CHECK(windows.counts().live == 0 && windows.counts().deregistrations == 1, "%zu windows left",
                   windows.counts().live);
        RANK_CHECK(fake.live_nccl_windows() == 0, "%zu fake windows left", fake.live_nccl_windows());
        return 0;
      });
  EXPECT_EQ(result, "");
}

// NCCL's registration waits in a barrier for every rank: a thread holding
// the allocator's or the heap's lock there would stop every other thread
// that allocates (and the allocation a peer's progress may need).
TEST(NcclWindowsFake, RegistrationRunsOutsideTheAllocatorsAndTheHeapsLocks) {
  const std::string result =
      on_two_ranks("unlocked", [](int rank, CachingAllocator& alloc, SymmetricHeap& heap) {
        FakeDriver& fake = FakeDriver::instance();
        void* a = alloc.allocate(4096, stream(1));
        heap.sync();
        std::atomic<bool> ran{false};
        fake.on_window_register([&] {
          // On another thread, as the allocator's other users are: the
          // registering thread waits for this one to return.
          void* p = alloc.allocate(4096, stream(2));
          alloc.deallocate(p, stream(2));
          heap.peer_ptr(a, 1 - rank);
          ran = true;
        });
        NcclWindows windows(heap, kComm, fake.nccl(), std::chrono::seconds(2));
        fake.on_window_register(nullptr);
        RANK_CHECK(ran.load(), "the registration never reached NCCL");
        RANK_CHECK(windows.counts().live == 1, "%zu windows", windows.counts().live);
        alloc.deallocate(a, stream(1));
        return 0;
      });
  EXPECT_EQ(result, "");
}

TEST(NcclWindowsFake, ARankStuckInNcclsBarrierFailsEveryRankNamingIt) {
  const std::string result =
      on_two_ranks("stuck", [](int rank, CachingAllocator& alloc, SymmetricHeap& heap) {
        FakeDriver& fake = FakeDriver::instance();
        void* a = alloc.allocate(4096, stream(1));
        heap.sync();
        if (rank == 1) fake.on_window_register([] { std::this_thread::sleep_for(std::chrono::seconds(30)); });
        try {
          NcclWindows windows(heap, kComm, fake.nccl(), std::chrono::seconds(1));
          RANK_CHECK(false, "a rank stuck in NCCL's registration went unnoticed");
        } catch (const timeout_error& e) {
          RANK_CHECK(std::strstr(e.what(), "rank 1: stuck ncclCommWindowRegister of the segment at offset 0"),
                     "%s", e.what());
        }
        // The heap is broken for good: no rank pairs with a peer stuck in NCCL.
        try {
          heap.sync();
          RANK_CHECK(false, "the heap went on after a failed registration");
        } catch (const collective_error& e) {
          RANK_CHECK(std::strstr(e.what(), "rank 1: stuck"), "%s", e.what());
        }
        alloc.deallocate(a, stream(1));
        std::fflush(nullptr);
        std::_Exit(0);  // rank 1's registration thread still sleeps in the fake NCCL
      });
  EXPECT_EQ(result, "");
}

TEST(NcclWindowsFake, ASegmentNcclRefusesOnOneRankStaysLocalOnEvery) {
  const std::string result =
      on_two_ranks("refused", [](int rank, CachingAllocator& alloc, SymmetricHeap& heap) {
        FakeDriver& fake = FakeDriver::instance();
        void* a = alloc.allocate(4096, stream(1));
        heap.sync();
        if (rank == 1) fake.fail("ncclCommWindowRegister", ncclInternalError);
        NcclWindows windows(heap, kComm, fake.nccl(), std::chrono::seconds(5));
        const WindowCounts counts = windows.counts();
        RANK_CHECK(counts.live == 0 && counts.registrations == 0 && counts.refusals == 1,
                   "live %zu, registered %llu, refused %llu", counts.live,
                   static_cast<unsigned long long>(counts.registrations),
                   static_cast<unsigned long long>(counts.refusals));
        RANK_CHECK(!windows.covers(a, 4096), "a is in a window its peer lacks");
        RANK_CHECK(fake.live_nccl_windows() == 0, "rank %d kept a window its peer lacks", rank);
        const std::string why = windows.last_refusal();
        RANK_CHECK(
            why.find("offset 0") != std::string::npos && why.find("rank 1: ncclCommWindowRegister: fake NCCL "
                                                                  "error") != std::string::npos,
            "%s", why.c_str());
        heap.sync();  // the heap goes on
        alloc.deallocate(a, stream(1));
        return 0;
      });
  EXPECT_EQ(result, "");
}

// Inside a graph capture NCCL's registration (its own stream, a sync) would
// end the capture: every rank defers to the next sync that changes the set.
TEST(NcclWindowsFake, WindowsWaitForASyncOutsideACapture) {
  const std::string result = on_two_ranks("capture", [](int rank, CachingAllocator& alloc,
                                                        SymmetricHeap& heap) {
    FakeDriver& fake = FakeDriver::instance();
    void* a = alloc.allocate(4096, stream(1));
    heap.sync();
    std::unique_ptr<NcclWindows> windows;
    {
      SymmetricHeap::DeviceWaitsForbidden capturing(heap, true);
      windows = std::make_unique<NcclWindows>(heap, kComm, fake.nccl(), std::chrono::seconds(5));
    }
    RANK_CHECK(windows->counts().live == 0 && fake.count("ncclCommWindowRegister") == 0,
               "registered during a capture");
    void* b = alloc.allocate(30 * MiB, stream(1));
    heap.sync();
    RANK_CHECK(windows->counts().live == 2, "%zu windows after the next sync", windows->counts().live);
    windows.reset();
    RANK_CHECK(fake.live_nccl_windows() == 0, "%zu windows outlived their owner", fake.live_nccl_windows());
    alloc.deallocate(b, stream(1));
    alloc.deallocate(a, stream(1));
    return 0;
  });
  EXPECT_EQ(result, "");
}

TEST(NcclWindowsFake, AnAbandonedCommunicatorIsNeverCalledAgain) {
  const std::string result =
      on_two_ranks("abandon", [](int rank, CachingAllocator& alloc, SymmetricHeap& heap) {
        FakeDriver& fake = FakeDriver::instance();
        void* a = alloc.allocate(4096, stream(1));
        heap.sync();
        {
          NcclWindows windows(heap, kComm, fake.nccl(), std::chrono::seconds(5));
          RANK_CHECK(windows.abandon() == 1, "abandoned a different number of windows");
          alloc.deallocate(a, stream(1));
          heap.release_cached();
          RANK_CHECK(windows.counts().abandoned == 1, "not counted as abandoned");
        }
        RANK_CHECK(fake.count("ncclCommWindowDeregister") == 0, "an abandoned window was deregistered");
        return 0;
      });
  EXPECT_EQ(result, "");
}

}  // namespace symmpool::test
