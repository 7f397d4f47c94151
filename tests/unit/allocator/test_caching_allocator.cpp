#include "fake_fixture.hpp"

#include <symmpool/error.hpp>

#include <algorithm>
#include <cstring>
#include <thread>

namespace symmpool::test {

using CachingAllocatorTest = FakeDriverTest;

TEST_F(CachingAllocatorTest, SmallRequestsShareOneSegment) {
  auto a = make_allocator();
  void* p = a->allocate(1000, stream(1));
  void* q = a->allocate(3000, stream(1));
  ASSERT_NE(p, nullptr);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(static_cast<char*>(q) - static_cast<char*>(p), 1024);  // 1000 rounds to 1024
  auto st = a->stats();
  EXPECT_EQ(st.segments.current, 1);
  EXPECT_EQ(st.reserved_bytes.current, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(st.allocated_bytes.current, 1024 + 3072);
  EXPECT_EQ(st.requested_bytes.current, 4000);
  EXPECT_EQ(st.cache_misses, 1u);
  EXPECT_EQ(st.cache_hits, 1u);  // q was cut from p's segment
  std::memset(p, 1, 1000);
  std::memset(q, 2, 3000);
  EXPECT_EQ(static_cast<char*>(p)[999], 1);
  a->deallocate(p, stream(1));
  a->deallocate(q, stream(1));
  EXPECT_EQ(a->stats().allocated_bytes.current, 0);
}

TEST_F(CachingAllocatorTest, SegmentSizesFollowRequestClasses) {
  auto a = make_allocator();
  a->allocate(1 * MiB, stream(1));       // small pool: 2 MiB segment
  a->allocate(1 * MiB + 1, stream(1));   // large, under 10 MiB: 20 MiB segment
  a->allocate(33 * MiB + 7, stream(1));  // large: rounded to 34 MiB
  std::vector<std::size_t> sizes;
  for (const Segment& s : a->segments()) sizes.push_back(s.size);
  std::sort(sizes.begin(), sizes.end());
  EXPECT_EQ(sizes, (std::vector<std::size_t>{2 * MiB, 20 * MiB, 34 * MiB}));
  // Live allocations are reported when the allocator goes away.
}

TEST_F(CachingAllocatorTest, FreedBlocksAreReusedAndMerged) {
  auto a = make_allocator();
  void* x = a->allocate(4 * MiB, stream(1));
  void* y = a->allocate(4 * MiB, stream(1));
  void* z = a->allocate(4 * MiB, stream(1));
  EXPECT_EQ(a->stats().segments.current, 1);  // all inside one 20 MiB segment
  a->deallocate(y, stream(1));
  a->deallocate(x, stream(1));  // merges with y's block
  void* w = a->allocate(8 * MiB, stream(1));
  EXPECT_EQ(w, x) << "x and y should have merged into one 8 MiB block";
  EXPECT_EQ(a->stats().segments.current, 1);
  a->deallocate(w, stream(1));
  a->deallocate(z, stream(1));
  // Everything merged back: one 20 MiB block serves a 20 MiB request.
  void* whole = a->allocate(20 * MiB - 512, stream(1));
  EXPECT_EQ(whole, x);
  a->deallocate(whole, stream(1));
}

// live_allocation finds the block around any byte of it, and a buffer freed
// and allocated again at the same address is told apart by its serial.
TEST_F(CachingAllocatorTest, LiveAllocationsAreFoundFromInsideAndNeverShareASerial) {
  auto a = make_allocator();
  char* x = static_cast<char*>(a->allocate(3000, stream(1)));
  char* y = static_cast<char*>(a->allocate(5000, stream(1)));
  auto whole = a->live_allocation(x, 3000);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->start, reinterpret_cast<std::uintptr_t>(x));
  EXPECT_EQ(whole->bytes, 3000u);
  auto inside = a->live_allocation(x + 100, 2900);
  ASSERT_TRUE(inside.has_value());
  EXPECT_EQ(inside->serial, whole->serial);
  EXPECT_NE(a->live_allocation(y, 1)->serial, whole->serial);
  EXPECT_FALSE(a->live_allocation(x + 100, 2901)) << "past the bytes asked for";
  EXPECT_FALSE(a->live_allocation(x, 3072 + 10)) << "spans into y's block";
  int on_stack = 0;
  EXPECT_FALSE(a->live_allocation(&on_stack, 4)) << "not ours";

  a->deallocate(x, stream(1));
  EXPECT_FALSE(a->live_allocation(x, 1)) << "freed";
  char* again = static_cast<char*>(a->allocate(3000, stream(1)));
  ASSERT_EQ(again, x) << "the cache should hand the same block back";
  ASSERT_TRUE(a->live_allocation(again, 3000).has_value());
  EXPECT_NE(a->live_allocation(again, 3000)->serial, whole->serial);
  a->deallocate(again, stream(1));
  a->deallocate(y, stream(1));
}

TEST_F(CachingAllocatorTest, EmptyCacheReleasesOnlyUnusedSegments) {
  auto a = make_allocator();
  void* keep = a->allocate(100, stream(1));
  void* drop = a->allocate(12 * MiB, stream(1));
  a->deallocate(drop, stream(1));
  EXPECT_EQ(a->stats().segments.current, 2);
  EXPECT_EQ(a->empty_cache(), 12 * MiB);
  EXPECT_EQ(a->stats().segments.current, 1);
  EXPECT_EQ(fake().used_memory(0), 2 * MiB);
  a->deallocate(keep, stream(1));
  EXPECT_EQ(a->empty_cache(), 2 * MiB);
  EXPECT_EQ(fake().used_memory(0), 0u);
  EXPECT_EQ(a->stats().reserved_bytes.peak, static_cast<std::int64_t>(14 * MiB));
  a->reset_peak_stats();
  EXPECT_EQ(a->stats().reserved_bytes.peak, 0);
}

// Blocks are free in stream order, so work queued before a free may still
// use the block; cuMemUnmap is not known to wait for it. Before this test, the
// cache was unmapped with the device still running it.
TEST_F(CachingAllocatorTest, EmptyCacheWaitsForTheDeviceBeforeUnmapping) {
  auto a = make_allocator();
  void* busy = a->allocate(12 * MiB, stream(1));
  a->deallocate(busy, stream(1));  // a kernel queued on stream 1 may still use it
  fake().clear_calls();
  EXPECT_EQ(a->empty_cache(), 12 * MiB);
  const std::vector<std::string> calls = fake().calls();
  const std::size_t sync = index_of(calls, "cuCtxSynchronize"), unmap = index_of(calls, "cuMemUnmap");
  ASSERT_LT(unmap, calls.size());
  EXPECT_LT(sync, unmap);
  // Nothing to release: no sync.
  void* held = a->allocate(12 * MiB, stream(1));
  fake().clear_calls();
  EXPECT_EQ(a->empty_cache(), 0u);
  EXPECT_EQ(fake().count("cuCtxSynchronize"), 0u);
  a->deallocate(held, stream(1));
}

TEST_F(CachingAllocatorTest, ASyncThatFailsUnmapsNothing) {
  auto a = make_allocator();
  void* p = a->allocate(12 * MiB, stream(1));
  a->deallocate(p, stream(1));
  fake().fail("cuCtxSynchronize", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_THROW(a->empty_cache(), cuda_error);
  EXPECT_EQ(fake().count("cuMemUnmap"), 0u);
  EXPECT_EQ(a->stats().segments.current, 1);
  EXPECT_EQ(fake().used_memory(0), 12 * MiB);
  EXPECT_EQ(a->empty_cache(), 12 * MiB);  // once the device can be waited for
}

// An unmap that fails leaves the range mapped: before this test it went
// back into circulation, and the next segment there failed to map.
TEST_F(CachingAllocatorTest, ARangeThatFailedToUnmapIsNotHandedOutAgain) {
  auto a = make_allocator();
  void* p = a->allocate(12 * MiB, stream(1));
  a->deallocate(p, stream(1));
  fake().fail("cuMemUnmap", CUDA_ERROR_INVALID_VALUE);
  EXPECT_THROW(a->empty_cache(), cuda_error);
  void* q = a->allocate(12 * MiB, stream(1));  // a new segment, at another range
  ASSERT_NE(q, nullptr);
  EXPECT_NE(q, p);
  std::memset(q, 3, 12 * MiB);
  a->deallocate(q, stream(1));
  // The fake left p mapped, as a failed unmap would: undo it so nothing leaks.
  EXPECT_EQ(fake().api().cuMemUnmap(reinterpret_cast<CUdeviceptr>(p), 12 * MiB), CUDA_SUCCESS);
}

// One failed unmap does not keep the other cached segments: each gets its
// unmap, and the failure is thrown once all were tried. Before, empty_cache
// stopped at the first failure and kept the rest.
TEST_F(CachingAllocatorTest, AFailedUnmapStillReleasesTheOtherSegments) {
  auto a = make_allocator();
  void* p = a->allocate(12 * MiB, stream(1));
  void* q = a->allocate(12 * MiB, stream(2));  // another stream: a segment of its own
  a->deallocate(p, stream(1));
  a->deallocate(q, stream(2));
  fake().fail("cuMemUnmap", CUDA_ERROR_INVALID_VALUE);
  EXPECT_THROW(a->empty_cache(), cuda_error);
  EXPECT_EQ(fake().count("cuMemUnmap"), 2u);
  EXPECT_EQ(a->stats().segments.current, 0);
  // The fake left one mapped, as a failed unmap would: undo it so nothing leaks.
  for (void* r : {p, q}) fake().api().cuMemUnmap(reinterpret_cast<CUdeviceptr>(r), 12 * MiB);
  EXPECT_EQ(fake().live_mappings(), 0u);
}

// An allocation that empties the cache to fit goes on when one unmap
// fails: what the others gave back is enough here. Before, the failure
// turned an allocation that fits into a cuda_error.
TEST_F(CachingAllocatorTest, AnAllocationStillFitsAfterAFailedUnmap) {
  auto a = make_allocator();
  std::vector<void*> ps;
  for (int i = 0; i < 40; ++i) ps.push_back(a->allocate(24 * MiB, stream(1)));
  for (void* p : ps) a->deallocate(p, stream(1));
  fake().fail("cuMemUnmap", CUDA_ERROR_INVALID_VALUE);
  void* big = a->allocate(512 * MiB, stream(2));
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(a->stats().oom_retries, 1u);
  a->deallocate(big, stream(2));
  for (void* p : ps) fake().api().cuMemUnmap(reinterpret_cast<CUdeviceptr>(p), 24 * MiB);
  EXPECT_EQ(fake().live_mappings(), 1u);  // `big`'s, cached
}

TEST_F(CachingAllocatorTest, OutOfMemoryEmptiesTheCacheAndRetries) {
  auto a = make_allocator();
  // Fill the 1 GiB device with cached, unused segments.
  std::vector<void*> ps;
  for (int i = 0; i < 40; ++i) ps.push_back(a->allocate(24 * MiB, stream(1)));
  for (void* p : ps) a->deallocate(p, stream(1));
  // On another stream: stream 1's own larger request would replace them first.
  void* big = a->allocate(512 * MiB, stream(2));
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(a->stats().oom_retries, 1u);
  EXPECT_EQ(a->stats().outgrown_segment_releases, 0u);
  a->deallocate(big, stream(2));
}

// A request larger than every free segment of its stream replaces them
// instead of mapping beside them. Before this test the pool kept them all:
// FSDP2's growing reduce-scatter inputs cost 2.68% of device memory more than
// stock at 1.4B parameters (docs/fsdp2_flag_memory.md).
TEST_F(CachingAllocatorTest, ALargerRequestReplacesTheFreeSegmentsOfItsStreamItOutgrew) {
  auto a = make_allocator();
  void* block_input = a->allocate(30 * MiB, stream(1));
  a->deallocate(block_input, stream(1));
  fake().clear_calls();
  void* root_input = a->allocate(50 * MiB, stream(1));  // the stream is idle: unmapped at once
  auto st = a->stats();
  EXPECT_EQ(st.segments.current, 1);
  EXPECT_EQ(st.reserved_bytes.current, static_cast<std::int64_t>(50 * MiB));
  EXPECT_EQ(st.outgrown_segment_releases, 1u);
  const std::vector<std::string> calls = fake().calls();
  const std::size_t record = index_of(calls, "cuEventRecord"), query = index_of(calls, "cuEventQuery"),
                    unmap = index_of(calls, "cuMemUnmap");
  ASSERT_LT(unmap, calls.size());
  EXPECT_LT(record, query);  // the stream's work before now, done
  EXPECT_LT(query, unmap);
  a->deallocate(root_input, stream(1));
  // From now on the larger segment serves both.
  void* again = a->allocate(30 * MiB, stream(1));
  EXPECT_EQ(again, root_input);
  EXPECT_EQ(a->stats().segment_maps, 2u);
  a->deallocate(again, stream(1));
}

// No wait under the allocator's lock (the stream may be waiting on a dead
// peer): a busy stream's outgrown segments leave the pool at once and are
// unmapped at a later allocation, once its work is done.
TEST_F(CachingAllocatorTest, OutgrownSegmentsOfABusyStreamGoOnceItsWorkIsDone) {
  auto a = make_allocator();
  void* small_input = a->allocate(30 * MiB, stream(1));
  a->deallocate(small_input, stream(1));
  fake().hold_events(true);  // stream 1 still runs what was queued
  void* big = a->allocate(50 * MiB, stream(1));
  EXPECT_EQ(a->stats().segments.current, 2);
  EXPECT_EQ(a->stats().outgrown_segment_releases, 1u);
  void* other = a->allocate(20 * MiB, stream(1));  // not served from the retired segment
  EXPECT_NE(other, small_input);
  EXPECT_EQ(a->stats().segments.current, 3);
  fake().complete_events();
  void* next = a->allocate(4096, stream(2));  // any allocation finishes what is done
  EXPECT_EQ(a->stats().segments.current, 3);
  EXPECT_EQ(a->stats().reserved_bytes.current, static_cast<std::int64_t>(50 * MiB + 20 * MiB + 2 * MiB));
  EXPECT_EQ(fake().count("cuStreamSynchronize") + fake().count("cuCtxSynchronize"), 0u);
  for (void* p : {big, other}) a->deallocate(p, stream(1));
  a->deallocate(next, stream(2));
  // empty_cache waits for a retired segment still pending, then unmaps it.
  void* again = a->allocate(60 * MiB, stream(1));  // retires 50 + 20, held pending
  EXPECT_EQ(a->empty_cache(), 70 * MiB + 2 * MiB);
  a->deallocate(again, stream(1));
  fake().hold_events(false);
}

// Ranks that allocate alike must place alike: a symmetric heap's buffers
// are at equal offsets on every rank, or their collectives go to NCCL. An
// outgrown segment is unmapped when its stream's work is done, a moment the
// GPU decides; had its range come back then, the next segments would take
// it on one rank and not on another (seen on 2 H200s with symmpool as the
// process's allocator: every FSDP2 reduce-scatter on NCCL in half the runs).
// Device 0 plays a rank whose stream was idle, device 1 one whose was busy.
TEST_F(CachingAllocatorTest, SegmentOffsetsDoNotDependOnWhenAnOutgrownSegmentWasUnmapped) {
  auto offset_of = [](const CachingAllocator& a, void* p) -> std::size_t {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    for (const Segment& s : a.segments())
      if (address >= s.address && address < s.address + s.size) return s.offset + (address - s.address);
    ADD_FAILURE() << "no segment holds " << p;
    return 0;
  };
  auto offsets_of_a_rank = [&](int device, bool busy) {
    auto a = make_allocator(device);
    a->deallocate(a->allocate(30 * MiB, stream(1)), stream(1));
    fake().hold_events(busy);
    void* grown = a->allocate(50 * MiB, stream(1));  // retires the 30 MiB segment: unmapped now if idle
    fake().complete_events();
    fake().hold_events(false);
    void* other = a->allocate(30 * MiB, stream(2));  // every rank has unmapped it by now
    std::vector<std::size_t> offsets{offset_of(*a, grown), offset_of(*a, other)};
    EXPECT_EQ(a->stats().outgrown_segment_releases, 1u);
    a->deallocate(grown, stream(1));
    a->deallocate(other, stream(2));
    // The range comes back at empty_cache, a point in program order.
    EXPECT_EQ(a->empty_cache(), 80 * MiB);
    void* after = a->allocate(30 * MiB, stream(1));
    offsets.push_back(offset_of(*a, after));
    a->deallocate(after, stream(1));
    return offsets;
  };
  const std::vector<std::size_t> idle = offsets_of_a_rank(0, false), busy = offsets_of_a_rank(1, true);
  EXPECT_EQ(idle, busy);
  EXPECT_EQ(idle, (std::vector<std::size_t>{30 * MiB, 80 * MiB, 0}));
}

// The same after empty_cache: a rank whose outgrown segment was unmapped
// (its range parked) before empty_cache, with nothing else to release,
// must place its next segment where a rank that unmaps it there does.
TEST_F(CachingAllocatorTest, SegmentOffsetsAfterEmptyCacheDoNotDependOnWhenAnOutgrownSegmentWasUnmapped) {
  auto next_offset_of_a_rank = [&](int device, bool busy) {
    auto a = make_allocator(device);
    a->deallocate(a->allocate(30 * MiB, stream(1)), stream(1));
    fake().hold_events(busy);
    void* grown = a->allocate(50 * MiB, stream(1));  // retires the 30 MiB segment: unmapped now if idle
    fake().hold_events(false);
    a->empty_cache();  // the busy rank waits for its stream and unmaps it here
    void* next = a->allocate(30 * MiB, stream(2));
    std::size_t offset = 0;
    for (const Segment& s : a->segments())
      if (reinterpret_cast<std::uintptr_t>(next) == s.address) offset = s.offset;
    a->deallocate(grown, stream(1));
    a->deallocate(next, stream(2));
    return offset;
  };
  EXPECT_EQ(next_offset_of_a_rank(0, false), 0u);
  EXPECT_EQ(next_offset_of_a_rank(1, true), 0u);
}

// A heap may publish a retiring segment (a sync while its stream was still
// busy): peers map it from then on, so it must not be unmapped alone.
TEST_F(CachingAllocatorTest, ARetiringSegmentPublishedMeanwhileGoesBackToThePool) {
  struct Publisher final : SegmentObserver {
    std::uint64_t kept = 0;
    void on_segment_mapped(const Segment&) override {}
    void on_segment_unmapping(const Segment&) noexcept override {}
    bool keeps_mapped(const Segment& s) const noexcept override { return s.id == kept; }
  } publisher;
  auto a = make_allocator();
  a->add_observer(&publisher, false);
  void* small_input = a->allocate(30 * MiB, stream(1));
  a->deallocate(small_input, stream(1));
  fake().hold_events(true);
  void* big = a->allocate(50 * MiB, stream(1));  // retires the 30 MiB segment, pending
  for (const Segment& seg : a->segments())
    if (seg.size == 30 * MiB) publisher.kept = seg.id;
  ASSERT_NE(publisher.kept, 0u);
  fake().complete_events();
  fake().hold_events(false);
  void* next = a->allocate(30 * MiB, stream(1));
  EXPECT_EQ(next, small_input) << "the published segment should serve its stream again";
  EXPECT_EQ(a->stats().segments.current, 2);
  EXPECT_EQ(fake().count("cuMemUnmap"), 0u);
  a->deallocate(next, stream(1));
  a->deallocate(big, stream(1));
  a->remove_observer(&publisher, false);
}

// A graph captured on another stream (global mode, torch's default) must
// not make allocations fail: before, the allocator's event queries were
// refused there (and would have invalidated the capture).
TEST_F(CachingAllocatorTest, AllocationsWorkWhileAnotherStreamCaptures) {
  auto a = make_allocator();
  void* shared = a->allocate(4 * MiB, stream(1));
  fake().hold_events(true);
  a->record_stream(shared, stream(2));
  a->deallocate(shared, stream(1));  // waits on an event
  fake().set_capturing(stream(3), true);
  void* p = nullptr;
  EXPECT_NO_THROW(p = a->allocate(4 * MiB, stream(1)));
  EXPECT_NO_THROW(a->deallocate(p, stream(1)));
  fake().set_capturing(stream(3), false);
  fake().complete_events();
  fake().hold_events(false);
}

// The hot path: a cache hit with no event to look at, and a free on the
// block's own stream, ask nothing of the driver (switching the capture mode
// around them was most of their time).
TEST_F(CachingAllocatorTest, ACacheHitAndAFreeOnItsStreamMakeNoDriverCall) {
  auto a = make_allocator();
  a->deallocate(a->allocate(4 * KiB, stream(1)), stream(1));
  a->deallocate(a->allocate(64 * MiB, stream(1)), stream(1));
  fake().clear_calls();
  for (std::size_t bytes : {4 * KiB, 64 * MiB}) {
    void* p = a->allocate(bytes, stream(1));
    a->deallocate(p, stream(1));
  }
  EXPECT_TRUE(fake().calls().empty()) << "first call: " << fake().calls().front();
  // A miss maps a segment, with the capture mode relaxed around it.
  void* big = a->allocate(256 * MiB, stream(1));
  EXPECT_EQ(fake().count("cuThreadExchangeStreamCaptureMode"), 2u);
  a->deallocate(big, stream(1));
}

TEST_F(CachingAllocatorTest, SegmentsInUseOnOtherStreamsOrInACaptureAreNotReplaced) {
  auto a = make_allocator();
  void* other_stream = a->allocate(30 * MiB, stream(2));
  void* live = a->allocate(30 * MiB, stream(1));
  void* pending = a->allocate(30 * MiB, stream(1));
  void* small = a->allocate(4096, stream(1));
  fake().hold_events(true);
  a->record_stream(pending, stream(3));
  a->deallocate(pending, stream(1));  // waits for stream 3's event
  a->deallocate(other_stream, stream(2));
  a->deallocate(small, stream(1));  // the small pool is not replaced
  void* big = a->allocate(40 * MiB, stream(1));
  EXPECT_EQ(a->stats().outgrown_segment_releases, 0u);
  EXPECT_EQ(a->stats().segments.current, 5);
  a->deallocate(big, stream(1));
  fake().complete_events();
  fake().hold_events(false);
  // In a capture nothing is retired: a new segment is mapped beside them.
  fake().set_capturing(stream(1), true);
  fake().clear_calls();
  void* captured = a->allocate(60 * MiB, stream(1));
  EXPECT_EQ(fake().count("cuEventRecord"), 0u);
  EXPECT_EQ(a->stats().outgrown_segment_releases, 0u);
  EXPECT_EQ(a->stats().segments.current, 6);
  fake().set_capturing(stream(1), false);
  // An event that cannot be recorded retires nothing either; the request is still served.
  fake().fail("cuEventRecord", CUDA_ERROR_LAUNCH_FAILED);
  void* after_failure = a->allocate(70 * MiB, stream(1));
  EXPECT_NE(after_failure, nullptr);
  EXPECT_EQ(a->stats().segments.current, 7);
  EXPECT_EQ(a->stats().outgrown_segment_releases, 0u);
  for (void* p : {live, captured, after_failure}) a->deallocate(p, stream(1));
}

// Per-stream pools add their peaks: a large request takes a whole-free
// segment another stream keeps idle instead of mapping beside it, and waits
// for that stream's work first. Before this test the pool mapped a new
// segment: FSDP2's root gradient (reduce-scatter stream) beside the idle
// root all-gather buffer (copy-in stream) cost the main job +2.2% of device
// memory over stock (docs/fsdp2_flag_memory.md, change 2).
TEST_F(CachingAllocatorTest, AnIdleSegmentOfAnotherStreamServesALargeRequest) {
  auto a = make_allocator();
  void* gathered = a->allocate(30 * MiB, stream(1));
  a->deallocate(gathered, stream(1));
  fake().clear_calls();
  void* grad = a->allocate(29 * MiB, stream(2));
  EXPECT_EQ(grad, gathered);
  EXPECT_EQ(a->stats().segment_maps, 1u);
  EXPECT_EQ(a->stats().segment_stream_moves, 1u);
  const std::vector<std::string> calls = fake().calls();
  EXPECT_LT(index_of(calls, "cuEventRecord"), index_of(calls, "cuStreamWaitEvent"));
  ASSERT_EQ(fake().stream_waits().size(), 1u);
  EXPECT_EQ(fake().stream_waits()[0], std::make_pair(stream(2), stream(1)));  // stream 2 waits for stream 1
  a->deallocate(grad, stream(2));
  // It now serves stream 2 without a wait, and goes back when stream 1 needs it.
  void* again = a->allocate(30 * MiB, stream(2));
  EXPECT_EQ(again, gathered);
  EXPECT_EQ(fake().stream_waits().size(), 1u);
  a->deallocate(again, stream(2));
  void* back = a->allocate(30 * MiB, stream(1));
  EXPECT_EQ(back, gathered);
  EXPECT_EQ(a->stats().segment_stream_moves, 2u);
  EXPECT_EQ(fake().stream_waits().back(), std::make_pair(stream(1), stream(2)));
  EXPECT_EQ(a->stats().segment_maps, 1u);
  a->deallocate(back, stream(1));
}

// Only a segment with nothing in use, nothing pending and of about the
// request's size moves; the smallest such, whatever the order they came in.
TEST_F(CachingAllocatorTest, OnlyAnIdleSegmentOfAboutTheRequestsSizeChangesStreams) {
  auto a = make_allocator();
  void* larger = a->allocate(40 * MiB, stream(1));  // more than a quarter over 30 MiB
  void* fits_loosely = a->allocate(36 * MiB, stream(3));
  void* fits = a->allocate(32 * MiB, stream(1));
  void* pending = a->allocate(30 * MiB, stream(1));
  void* shared = a->allocate(60 * MiB, stream(1));
  void* in_use = a->allocate(30 * MiB, stream(1));
  a->deallocate(shared, stream(1));
  void* half = a->allocate(24 * MiB, stream(1));  // cut from `shared`'s segment: part of it in use
  fake().hold_events(true);
  a->record_stream(pending, stream(4));
  for (void* p : {larger, fits, pending}) a->deallocate(p, stream(1));
  a->deallocate(fits_loosely, stream(3));
  const std::uint64_t maps = a->stats().segment_maps;
  void* p = a->allocate(30 * MiB, stream(2));
  EXPECT_EQ(p, fits) << "the smallest idle segment that fits, not the pending one, nor the larger ones";
  EXPECT_EQ(a->stats().segment_maps, maps);
  void* q = a->allocate(30 * MiB, stream(2));
  EXPECT_EQ(q, fits_loosely) << "then the next smallest, from any other stream";
  void* r = a->allocate(30 * MiB, stream(2));
  EXPECT_EQ(a->stats().segment_maps, maps + 1)
      << "only the pending or too large ones are left: a new segment";
  EXPECT_NE(r, larger);
  EXPECT_NE(r, pending);
  EXPECT_EQ(a->stats().segment_stream_moves, 2u);
  for (void* x : {p, q, r}) a->deallocate(x, stream(2));
  for (void* x : {half, in_use}) a->deallocate(x, stream(1));
  fake().complete_events();
  fake().hold_events(false);
}

// In a capture, or where the event cannot be recorded or waited for, a new
// segment serves the request: the stream must never go unordered.
TEST_F(CachingAllocatorTest, NoSegmentChangesStreamsInACaptureOrWithoutAnEvent) {
  {
    auto a = make_allocator();
    void* idle = a->allocate(30 * MiB, stream(1));
    a->deallocate(idle, stream(1));
    fake().set_capturing(stream(2), true);
    void* captured = a->allocate(30 * MiB, stream(2));
    EXPECT_NE(captured, idle);
    fake().set_capturing(stream(2), false);
    fake().set_capturing(stream(1), true);  // the idle segment's own stream
    void* while_its_stream_captures = a->allocate(30 * MiB, stream(3));
    EXPECT_NE(while_its_stream_captures, idle);
    fake().set_capturing(stream(1), false);
    EXPECT_EQ(a->stats().segment_stream_moves, 0u);
    a->deallocate(captured, stream(2));
    a->deallocate(while_its_stream_captures, stream(3));
  }
  for (const char* call : {"cuEventCreate", "cuEventRecord", "cuStreamWaitEvent"}) {
    auto a = make_allocator();
    void* idle = a->allocate(30 * MiB, stream(1));
    a->deallocate(idle, stream(1));
    fake().fail(call, CUDA_ERROR_LAUNCH_FAILED);
    void* p = a->allocate(30 * MiB, stream(2));
    EXPECT_NE(p, idle) << call;
    EXPECT_EQ(a->stats().segment_stream_moves, 0u) << call;
    a->deallocate(p, stream(2));
  }
  EXPECT_TRUE(fake().stream_waits().empty());
}

// SYMMPOOL_SEGMENT_MOVES=0: every stream keeps its own segments, as before.
TEST_F(CachingAllocatorTest, WithSegmentMovesOffEachStreamKeepsItsOwnSegments) {
  Environment env;
  env.segment_moves = false;
  auto a = make_allocator(0, false, env);
  void* idle = a->allocate(30 * MiB, stream(1));
  a->deallocate(idle, stream(1));
  void* p = a->allocate(30 * MiB, stream(2));
  EXPECT_NE(p, idle);
  EXPECT_EQ(a->stats().segment_maps, 2u);
  EXPECT_EQ(a->stats().segment_stream_moves, 0u);
  EXPECT_TRUE(fake().stream_waits().empty());
  a->deallocate(p, stream(2));
}

// Two idle segments of the same size: the lower address moves, whichever
// stream freed it last, so ranks that allocate alike take the same one.
TEST_F(CachingAllocatorTest, OfTwoEqualIdleSegmentsTheLowerAddressMoves) {
  auto a = make_allocator();
  void* low = a->allocate(30 * MiB, stream(1));
  void* high = a->allocate(30 * MiB, stream(3));
  ASSERT_LT(low, high);
  a->deallocate(high, stream(3));
  a->deallocate(low, stream(1));
  EXPECT_EQ(a->allocate(30 * MiB, stream(2)), low);
  EXPECT_EQ(a->allocate(30 * MiB, stream(2)), high);
  for (void* p : {low, high}) a->deallocate(p, stream(2));
}

// Steps that repeat the same requests stop mapping after the first.
TEST_F(CachingAllocatorTest, RepeatedStepsSettleWithoutMappingAgain) {
  auto a = make_allocator();
  auto step = [&] {
    void* x = a->allocate(30 * MiB, stream(1));
    a->deallocate(x, stream(1));
    void* y = a->allocate(50 * MiB, stream(1));
    void* z = a->allocate(24 * MiB, stream(1));  // while y lives
    a->deallocate(y, stream(1));
    void* w = a->allocate(80 * MiB, stream(1));  // while z lives
    a->deallocate(z, stream(1));
    a->deallocate(w, stream(1));
  };
  step();
  const std::uint64_t maps = a->stats().segment_maps;
  for (int i = 0; i < 10; ++i) step();
  EXPECT_EQ(a->stats().segment_maps, maps);
}

TEST_F(CachingAllocatorTest, OutOfMemoryErrorNamesTheSizes) {
  auto a = make_allocator();
  void* held = a->allocate(800 * MiB, stream(1));
  try {
    a->allocate(300 * MiB, stream(1));
    FAIL() << "expected out_of_memory";
  } catch (const out_of_memory& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory on device 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tried to allocate 300.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("800.00 MiB"), std::string::npos) << msg;  // reserved
    EXPECT_NE(msg.find("224.00 MiB"), std::string::npos) << msg;  // device free
    EXPECT_NE(msg.find("largest free cached block is 0 B"), std::string::npos) << msg;
  }
  EXPECT_EQ(a->stats().ooms, 1u);
  a->deallocate(held, stream(1));
}

TEST_F(CachingAllocatorTest, StatisticsTrackPeaksAndCounts) {
  auto a = make_allocator();
  void* p = a->allocate(5 * MiB, stream(1));
  void* q = a->allocate(5 * MiB, stream(1));
  a->deallocate(p, stream(1));
  a->deallocate(q, stream(1));
  auto st = a->stats();
  EXPECT_EQ(st.allocations, 2u);
  EXPECT_EQ(st.frees, 2u);
  EXPECT_EQ(st.allocated_bytes.peak, static_cast<std::int64_t>(10 * MiB));
  EXPECT_EQ(st.active_blocks.peak, 2);
  EXPECT_EQ(st.active_blocks.current, 0);
  EXPECT_EQ(st.segment_maps, 1u);
  EXPECT_EQ(st.allocated_bytes.increased, static_cast<std::int64_t>(10 * MiB));
  EXPECT_EQ(st.allocated_bytes.decreased, static_cast<std::int64_t>(10 * MiB));
  EXPECT_EQ(st.large_pool.active_blocks.increased, 2);
  a->reset_accumulated_stats();
  st = a->stats();
  EXPECT_EQ(st.allocations, 0u);
  EXPECT_EQ(st.segment_maps, 0u);
  EXPECT_EQ(st.allocated_bytes.increased, 0);
  EXPECT_EQ(st.large_pool.active_blocks.decreased, 0);
  EXPECT_EQ(st.reserved_bytes.current, static_cast<std::int64_t>(20 * MiB));  // what is held stays
}

TEST_F(CachingAllocatorTest, PoolsAndTheSnapshotShowWhereBytesAre) {
  auto a = make_allocator();
  void* small = a->allocate(1000, stream(1));
  void* large = a->allocate(4 * MiB, stream(2));
  void* freed = a->allocate(6 * MiB, stream(2));
  a->deallocate(freed, stream(2));
  const AllocatorStats st = a->stats();
  EXPECT_EQ(st.small_pool.allocated_bytes.current, 1024);
  EXPECT_EQ(st.small_pool.requested_bytes.current, 1000);
  EXPECT_EQ(st.small_pool.reserved_bytes.current, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(st.large_pool.allocated_bytes.current, static_cast<std::int64_t>(4 * MiB));
  EXPECT_EQ(st.large_pool.allocated_bytes.peak, static_cast<std::int64_t>(10 * MiB));
  EXPECT_EQ(st.large_pool.reserved_bytes.current, static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(st.large_pool.segments.current, 1);
  const std::vector<SegmentSnapshot> segments = a->snapshot();
  ASSERT_EQ(segments.size(), 2u);
  const SegmentSnapshot& s = segments[0].small ? segments[0] : segments[1];
  const SegmentSnapshot& l = segments[0].small ? segments[1] : segments[0];
  EXPECT_EQ(s.stream, stream(1));
  ASSERT_EQ(s.blocks.size(), 2u);  // ours, then the rest of the segment, free
  EXPECT_EQ(s.blocks[0].address, reinterpret_cast<std::uintptr_t>(small));
  EXPECT_TRUE(s.blocks[0].allocated);
  EXPECT_EQ(s.blocks[0].requested, 1000u);
  EXPECT_FALSE(s.blocks[1].allocated);
  EXPECT_EQ(l.stream, stream(2));
  ASSERT_EQ(l.blocks.size(), 2u);  // the 4 MiB block, then 16 MiB free (the freed 6 MiB merged back)
  EXPECT_EQ(l.blocks[0].address, reinterpret_cast<std::uintptr_t>(large));
  EXPECT_EQ(l.blocks[1].size, 16 * MiB);
  EXPECT_EQ(a->largest_free_block(), 16 * MiB);
  a->reset_peak_stats();
  EXPECT_EQ(a->stats().large_pool.allocated_bytes.peak, static_cast<std::int64_t>(4 * MiB));
  a->deallocate(small, stream(1));
  a->deallocate(large, stream(2));
}

TEST_F(CachingAllocatorTest, ThreadSafeUnderConcurrentUse) {
  auto a = make_allocator();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        void* p = a->allocate(static_cast<std::size_t>((i % 7 + 1) * 4096), stream(t + 1));
        static_cast<char*>(p)[0] = static_cast<char>(t);
        a->deallocate(p, stream(t + 1));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(a->stats().allocations, 8000u);
  EXPECT_EQ(a->stats().active_blocks.current, 0);
}

}  // namespace symmpool::test
