// Private pools (CUDA graphs, torch.cuda.MemPool) on the fake driver: what
// goes to them, what stays theirs, when their memory goes back, and the
// checkpoints CUDA graph trees take and restore.

#include "fake_fixture.hpp"

#include <symmpool/error.hpp>

#include <iterator>
#include <map>
#include <random>
#include <unordered_set>

namespace symmpool::test {

using PrivatePoolTest = FakeDriverTest;

constexpr PoolId kGraphPool{0, 1};
constexpr PoolId kUserPool{1, 0};

StreamFilter only(CUstream s) {
  return [s](CUstream candidate) { return candidate == s; };
}

std::size_t segments_of(const CachingAllocator& a, PoolId pool) {
  std::size_t n = 0;
  for (const SegmentSnapshot& s : a.snapshot()) n += s.pool == pool;
  return n;
}

// Where two free blocks of a segment are neighbours (a merge was missed), the first one's address; else 0.
std::uintptr_t unmerged_free_neighbours(const CachingAllocator& a) {
  for (const SegmentSnapshot& s : a.snapshot())
    for (std::size_t i = 1; i < s.blocks.size(); ++i)
      if (!s.blocks[i - 1].allocated && !s.blocks[i - 1].pending && !s.blocks[i].allocated &&
          !s.blocks[i].pending)
        return s.blocks[i - 1].address;
  return 0;
}

// A graph's allocations come from its own segments, and a block freed in the
// capture is reused there but never by an allocation outside it: the
// graph's replays still write into it.
TEST_F(PrivatePoolTest, CapturedAllocationsStayInTheirPool) {
  auto a = make_allocator();
  a->begin_allocate_to_pool(kGraphPool, only(stream(2)));
  void* captured = a->allocate(4 * MiB, stream(2));
  void* eager = a->allocate(4 * MiB, stream(1));  // another stream: the default pool
  EXPECT_EQ(segments_of(*a, kGraphPool), 1u);
  EXPECT_EQ(segments_of(*a, kDefaultPool), 1u);
  a->deallocate(captured, stream(2));
  void* again = a->allocate(4 * MiB, stream(2));
  EXPECT_EQ(again, captured) << "reused inside the capture";
  a->deallocate(again, stream(2));
  a->end_allocate_to_pool(kGraphPool);

  void* after = a->allocate(4 * MiB, stream(2));
  EXPECT_NE(after, captured) << "the graph's block went to an allocation outside it";
  EXPECT_EQ(segments_of(*a, kDefaultPool), 2u);
  // Its segments stay while the graph lives, even through empty_cache.
  a->deallocate(after, stream(2));
  a->empty_cache();
  EXPECT_EQ(segments_of(*a, kGraphPool), 1u);
  EXPECT_EQ(segments_of(*a, kDefaultPool), 1u);  // eager's
  // The graph is destroyed: its free segment goes back, and the pool with it.
  a->release_pool(kGraphPool);
  a->empty_cache();
  EXPECT_EQ(segments_of(*a, kGraphPool), 0u);
  expect_error<std::logic_error>([&] { a->pool_use_count(kGraphPool); }, "no private pool (0, 1)");
  a->deallocate(eager, stream(1));
}

// A tensor made in the capture can outlive its graph: the segment stays until it is freed.
TEST_F(PrivatePoolTest, AReleasedPoolKeepsWhatIsStillLive) {
  auto a = make_allocator();
  a->begin_allocate_to_pool(kGraphPool, only(stream(1)));
  void* output = a->allocate(1000, stream(1));
  a->end_allocate_to_pool(kGraphPool);
  a->release_pool(kGraphPool);
  EXPECT_EQ(a->empty_cache(), 0u);
  EXPECT_EQ(segments_of(*a, kGraphPool), 1u);
  a->deallocate(output, stream(1));
  EXPECT_EQ(a->empty_cache(), 2 * MiB);
  EXPECT_EQ(segments_of(*a, kGraphPool), 0u);
  EXPECT_EQ(a->stats().reserved_bytes.current, 0);
}

// torch.cuda.MemPool: made with a use, used in a `with` (one more, released
// at its end), emptied by its own empty_cache once its owner lets it go.
TEST_F(PrivatePoolTest, AUserPoolCountsItsUses) {
  auto a = make_allocator();
  a->create_or_incref_pool(kUserPool);
  a->begin_allocate_to_pool(kUserPool, [](CUstream) { return true; });
  EXPECT_EQ(a->pool_use_count(kUserPool), 2);
  void* p = a->allocate(30 * MiB, stream(1));
  a->end_allocate_to_pool(kUserPool);
  a->release_pool(kUserPool);
  EXPECT_EQ(a->pool_use_count(kUserPool), 1);
  a->deallocate(p, stream(1));
  EXPECT_EQ(a->empty_pool_cache(kUserPool), 0u) << "still in use";
  a->release_pool(kUserPool);
  EXPECT_EQ(a->empty_pool_cache(kUserPool), 30 * MiB);
  EXPECT_EQ(a->stats().segments.current, 0);
  // A pool nothing allocated in goes at once.
  a->create_or_incref_pool(kGraphPool);
  a->release_pool(kGraphPool);
  expect_error<std::logic_error>([&] { a->release_pool(kGraphPool); }, "no private pool");
}

// The latest pool begun is asked first; the others still get their streams.
TEST_F(PrivatePoolTest, RoutesAreAskedLatestFirst) {
  auto a = make_allocator();
  a->begin_allocate_to_pool(kUserPool, [](CUstream) { return true; });
  a->begin_allocate_to_pool(kGraphPool, only(stream(2)));
  void* graph = a->allocate(1000, stream(2));
  void* user = a->allocate(1000, stream(1));
  std::unordered_set<void*> expected_graph{graph}, expected_user{user};
  EXPECT_TRUE(a->pool_live_allocations_are(kGraphPool, expected_graph));
  EXPECT_TRUE(a->pool_live_allocations_are(kUserPool, expected_user));
  EXPECT_FALSE(a->pool_live_allocations_are(kUserPool, expected_graph));
  EXPECT_FALSE(a->pool_live_allocations_are(kUserPool, {}));
  a->end_allocate_to_pool(kGraphPool);
  a->end_allocate_to_pool(kUserPool);
  a->deallocate(graph, stream(2));
  a->deallocate(user, stream(1));
  a->release_pool(kGraphPool);
  a->release_pool(kUserPool);
  a->empty_cache();
}

TEST_F(PrivatePoolTest, MisuseIsAnError) {
  auto a = make_allocator();
  expect_error<std::logic_error>([&] { a->begin_allocate_to_pool(kDefaultPool, only(stream(1))); },
                                 "names the default pool");
  expect_error<std::logic_error>([&] { a->end_allocate_to_pool(kGraphPool); }, "not allocating to");
  expect_error<std::logic_error>([&] { a->begin_allocate_to_pool(kGraphPool, nullptr); }, "no stream filter");
  a->begin_allocate_to_pool(kGraphPool, only(stream(1)));
  expect_error<std::logic_error>([&] { a->begin_allocate_to_pool(kGraphPool, only(stream(1))); },
                                 "already allocating to private pool (0, 1)");
  a->end_allocate_to_pool(kGraphPool);
  a->release_pool(kGraphPool);  // the failed begin added a use too, as PyTorch's does
  a->release_pool(kGraphPool);
  expect_error<std::logic_error>([&] { a->checkpoint_pool(kGraphPool); }, "no private pool");
}

// A block used on another stream and freed while a capture may be under way
// waits for the capture's end before its event is recorded: an event
// recorded in a capture orders nothing outside the graph.
TEST_F(PrivatePoolTest, CrossStreamFreesWaitForTheCaptureToEnd) {
  auto a = make_allocator();
  void* shared = a->allocate(4 * MiB, stream(1));
  a->record_stream(shared, stream(3));
  a->begin_allocate_to_pool(kGraphPool, only(stream(2)));
  fake().clear_calls();
  a->deallocate(shared, stream(1));
  void* captured = a->allocate(4 * MiB, stream(2));
  EXPECT_EQ(fake().count("cuEventRecord"), 0u);
  void* meanwhile = a->allocate(4 * MiB, stream(1));
  EXPECT_NE(meanwhile, shared) << "reused before stream 3's work";
  a->end_allocate_to_pool(kGraphPool);
  void* next = a->allocate(1000, stream(1));  // records the deferred event
  EXPECT_EQ(fake().count("cuEventRecord"), 1u);
  for (void* p : {next, meanwhile}) a->deallocate(p, stream(1));
  a->deallocate(captured, stream(2));
  a->release_pool(kGraphPool);
}

// CUDA graph trees checkpoint a pool after recording and, to record a new
// branch after replays, put the checkpoint back: the live blocks of now are
// freed, the checkpoint's live blocks are live again at their addresses.
TEST_F(PrivatePoolTest, ACheckpointPutsBackThePoolsLiveBlocks) {
  auto a = make_allocator();
  a->begin_allocate_to_pool(kGraphPool, only(stream(1)));
  void* x = a->allocate(1000, stream(1));
  void* y = a->allocate(5000, stream(1));
  void* z = a->allocate(3 * MiB, stream(1));
  a->deallocate(y, stream(1));
  const PoolCheckpoint checkpoint = a->checkpoint_pool(kGraphPool);
  ASSERT_EQ(checkpoint.segments.size(), 2u);
  const auto stats_then = a->stats();

  // Later: x dies, new blocks are made in the pool.
  a->deallocate(x, stream(1));
  void* w = a->allocate(20000, stream(1));
  void* v = a->allocate(40 * MiB, stream(1));  // a segment the checkpoint does not have
  const PoolRestore restore = a->restore_pool(checkpoint);
  EXPECT_EQ(std::unordered_set<void*>(restore.freed.begin(), restore.freed.end()),
            (std::unordered_set<void*>{z, w, v}));
  EXPECT_EQ(std::unordered_set<void*>(restore.allocated.begin(), restore.allocated.end()),
            (std::unordered_set<void*>{x, z}));
  EXPECT_TRUE(a->pool_live_allocations_are(kGraphPool, {x, z}));
  EXPECT_EQ(unmerged_free_neighbours(*a), 0u);
  EXPECT_EQ(a->allocation_size(x), 1000u);
  EXPECT_EQ(a->stats().allocated_bytes.current, stats_then.allocated_bytes.current);
  EXPECT_EQ(a->stats().requested_bytes.current, stats_then.requested_bytes.current);
  // The freed space is whole again: y's place serves y's size.
  void* y2 = a->allocate(5000, stream(1));
  EXPECT_EQ(y2, y);
  a->end_allocate_to_pool(kGraphPool);
  for (void* p : {x, y2, z}) a->deallocate(p, stream(1));
  a->release_pool(kGraphPool);
  a->empty_cache();
  EXPECT_EQ(a->stats().segments.current, 0);
}

// A block still waiting for another stream when the checkpoint was taken
// is free by the restore: carved back as free beside the free rest of its
// segment, the two are one block again, as a free would leave them.
TEST_F(PrivatePoolTest, ARestoredCheckpointLeavesNoFreeNeighboursApart) {
  auto a = make_allocator();
  a->begin_allocate_to_pool(kUserPool, only(stream(1)));
  void* x = a->allocate(1000, stream(1));
  void* y = a->allocate(5000, stream(1));
  a->end_allocate_to_pool(kUserPool);
  a->record_stream(y, stream(3));
  fake().hold_events(true);
  a->deallocate(y, stream(1));  // waits on stream 3's event
  const PoolCheckpoint checkpoint = a->checkpoint_pool(kUserPool);
  ASSERT_EQ(checkpoint.segments.size(), 1u);
  ASSERT_EQ(checkpoint.segments[0].blocks.size(), 3u) << "x, y (pending), the rest";
  fake().complete_events();
  fake().hold_events(false);
  const PoolRestore restore = a->restore_pool(checkpoint);
  EXPECT_EQ(restore.allocated, std::vector<void*>{x});
  EXPECT_EQ(unmerged_free_neighbours(*a), 0u);
  a->begin_allocate_to_pool(kUserPool, only(stream(1)));
  void* joined = a->allocate(512 * KiB, stream(1));  // fits only where y and the rest are one block
  a->end_allocate_to_pool(kUserPool);
  EXPECT_EQ(joined, y);
  for (void* p : {x, joined}) a->deallocate(p, stream(1));
  a->release_pool(kUserPool);
}

TEST_F(PrivatePoolTest, ACheckpointWhoseSegmentIsGoneIsRefused) {
  auto a = make_allocator();
  a->create_or_incref_pool(kUserPool);
  a->begin_allocate_to_pool(kUserPool, only(stream(1)));
  void* p = a->allocate(1000, stream(1));
  a->end_allocate_to_pool(kUserPool);
  PoolCheckpoint checkpoint = a->checkpoint_pool(kUserPool);
  checkpoint.segments[0].address += 2 * MiB;
  expect_error<std::logic_error>([&] { a->restore_pool(checkpoint); }, "is no longer in private pool (1, 0)");
  EXPECT_TRUE(a->is_allocation(p)) << "nothing changed";
  a->deallocate(p, stream(1));
  a->release_pool(kUserPool);  // the use begin_allocate_to_pool added
  a->release_pool(kUserPool);  // and the one it was created with
  expect_error<std::logic_error>([&] { a->restore_pool(a->checkpoint_pool(kUserPool)); }, "was released");
  a->empty_pool_cache(kUserPool);
}

// Random work over the default pool and a series of graph pools (stream 2
// routed while a "capture" runs, checkpoints taken and put back, pools
// released with live blocks left): live blocks never overlap, each lies in
// the pool it was made for, every pool's live set is what the model says,
// and at the end nothing is left.
using RandomPrivatePoolTest = LargeFakeDeviceTest;

TEST_F(RandomPrivatePoolTest, RandomWorkKeepsEveryBlockInItsPool) {
  auto a = make_allocator();
  std::mt19937_64 rng(2026);
  struct Live {
    std::size_t size;
    CUstream stream;
    PoolId pool;
  };
  std::map<std::uintptr_t, Live> live;
  auto pool_of = [&](std::uintptr_t address) {
    for (const SegmentSnapshot& s : a->snapshot())
      if (address >= s.address && address < s.address + s.size) return s.pool;
    ADD_FAILURE() << "no segment holds " << address;
    return kDefaultPool;
  };
  auto live_set = [&](PoolId pool) {
    std::unordered_set<void*> set;
    for (const auto& [address, l] : live)
      if (l.pool == pool) set.insert(reinterpret_cast<void*>(address));
    return set;
  };
  std::uint64_t next_pool = 1;
  PoolId capturing = kDefaultPool;  // the pool routed to now, if any
  std::map<PoolId, PoolCheckpoint> checkpoints;
  int restores = 0, in_a_pool = 0;
  for (int op = 0; op < 20000; ++op) {
    const std::uint64_t r = rng() % 100;
    if (r < 2 && capturing == kDefaultPool) {  // a capture begins
      capturing = {0, next_pool++};
      a->begin_allocate_to_pool(capturing, only(stream(2)));
    } else if (r < 4 && capturing != kDefaultPool) {  // it ends: checkpointed, sometimes released at once
      a->end_allocate_to_pool(capturing);
      checkpoints[capturing] = a->checkpoint_pool(capturing);
      if (rng() % 2 == 0) {
        a->release_pool(capturing);
        checkpoints.erase(capturing);
      }
      capturing = kDefaultPool;
    } else if (r < 5 && !checkpoints.empty()) {  // a graph tree puts a checkpoint back
      auto it = std::next(checkpoints.begin(), static_cast<std::ptrdiff_t>(rng() % checkpoints.size()));
      const PoolRestore restore = a->restore_pool(it->second);
      ++restores;
      for (void* p : restore.freed) live.erase(reinterpret_cast<std::uintptr_t>(p));
      for (const PoolCheckpoint::Segment& s : it->second.segments)
        for (const PoolCheckpoint::Block& b : s.blocks)
          if (b.allocated) live[b.address] = Live{b.requested, stream(2), it->first};
      ASSERT_TRUE(a->pool_live_allocations_are(it->first, live_set(it->first)));
      ASSERT_EQ(unmerged_free_neighbours(*a), 0u) << "after restore " << restores;
    } else if (r < 6 && !checkpoints.empty()) {  // a graph is destroyed, its outputs may live on
      a->release_pool(checkpoints.begin()->first);
      checkpoints.erase(checkpoints.begin());
    } else if (live.empty() || (live.size() < 150 && r % 2 == 0)) {
      const std::size_t size = r < 60 ? 1 + rng() % (64 * KiB) : 1 * MiB + rng() % (24 * MiB);
      CUstream s = stream(1 + static_cast<int>(rng() % 2));
      void* p = a->allocate(size, s);
      const auto address = reinterpret_cast<std::uintptr_t>(p);
      auto next = live.lower_bound(address);
      ASSERT_TRUE(next == live.end() || address + size <= next->first) << "overlaps the next block";
      if (next != live.begin()) {
        ASSERT_LE(std::prev(next)->first + std::prev(next)->second.size, address);
      }
      const PoolId pool = capturing != kDefaultPool && s == stream(2) ? capturing : kDefaultPool;
      ASSERT_EQ(pool_of(address), pool) << "op " << op;
      live[address] = Live{size, s, pool};
      in_a_pool += pool != kDefaultPool;
    } else {
      auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
      a->deallocate(reinterpret_cast<void*>(it->first), it->second.stream);
      live.erase(it);
    }
    if (op % 500 == 0) {
      for (const auto& [pool, checkpoint] : checkpoints)
        ASSERT_TRUE(a->pool_live_allocations_are(pool, live_set(pool))) << "op " << op;
      if (capturing != kDefaultPool) {
        ASSERT_TRUE(a->pool_live_allocations_are(capturing, live_set(capturing)));
      }
      ASSERT_EQ(a->stats().active_blocks.current, static_cast<std::int64_t>(live.size())) << "op " << op;
    }
    if (op % 3000 == 2999) a->empty_cache();
  }
  if (capturing != kDefaultPool) {
    a->end_allocate_to_pool(capturing);
    a->release_pool(capturing);
  }
  EXPECT_GT(restores, 50);
  EXPECT_GT(in_a_pool, 1000);
  EXPECT_GT(next_pool, 100u);
  for (const auto& [pool, checkpoint] : checkpoints) a->release_pool(pool);
  for (const auto& [address, l] : live) a->deallocate(reinterpret_cast<void*>(address), l.stream);
  a->empty_cache();
  EXPECT_EQ(a->stats().segments.current, 0);
  EXPECT_EQ(a->stats().reserved_bytes.current, 0);
}

}  // namespace symmpool::test
