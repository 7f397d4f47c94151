#include "fake_fixture.hpp"

#include <symmpool/error.hpp>

#include <string>

namespace symmpool::test {

using StreamOrderingTest = FakeDriverTest;

TEST_F(StreamOrderingTest, FreedBlockIsReusedOnItsOwnStreamAtOnce) {
  auto a = make_allocator();
  void* p = a->allocate(4096, stream(1));
  a->deallocate(p, stream(1));
  EXPECT_EQ(a->allocate(4096, stream(1)), p);
  EXPECT_EQ(fake().count("cuEventRecord"), 0u);  // no cross-stream use, no event
}

TEST_F(StreamOrderingTest, OtherStreamsNeverGetAnotherStreamsBlock) {
  auto a = make_allocator();
  void* p = a->allocate(4096, stream(1));
  a->deallocate(p, stream(1));
  void* q = a->allocate(4096, stream(2));
  EXPECT_NE(q, p);
  EXPECT_EQ(a->stats().segments.current, 2);
  a->deallocate(q, stream(2));
}

TEST_F(StreamOrderingTest, RecordStreamDelaysReuseUntilTheEventCompletes) {
  auto a = make_allocator();
  fake().hold_events(true);
  void* p = a->allocate(4096, stream(1));
  a->record_stream(p, stream(2));
  a->record_stream(p, stream(1));  // its own stream: nothing to wait for
  a->deallocate(p, stream(1));
  EXPECT_EQ(fake().count("cuEventRecord"), 1u);
  void* q = a->allocate(4096, stream(1));
  EXPECT_NE(q, p) << "reused while stream 2 may still use it";
  fake().complete_events();
  void* r = a->allocate(4096, stream(1));
  EXPECT_EQ(r, p) << "reusable once the event completed";
  a->deallocate(q, stream(1));
  a->deallocate(r, stream(1));
}

TEST_F(StreamOrderingTest, FreeOnAnotherStreamWaitsForThatStream) {
  auto a = make_allocator();
  fake().hold_events(true);
  void* p = a->allocate(4096, stream(1));
  a->deallocate(p, stream(3));
  EXPECT_EQ(fake().count("cuEventRecord"), 1u);
  EXPECT_NE(a->allocate(4096, stream(1)), p);
  fake().complete_events();
  EXPECT_EQ(a->allocate(4096, stream(1)), p);
}

TEST_F(StreamOrderingTest, EmptyCacheWaitsForPendingFrees) {
  auto a = make_allocator();
  fake().hold_events(true);
  void* p = a->allocate(4096, stream(1));
  a->record_stream(p, stream(2));
  a->deallocate(p, stream(1));
  EXPECT_EQ(a->empty_cache(), 2 * MiB);  // synchronized on the event, then released
  EXPECT_GE(fake().count("cuEventSynchronize"), 1u);
  EXPECT_EQ(a->stats().segments.current, 0);
}

TEST_F(StreamOrderingTest, PendingBlocksDoNotMergeEarly) {
  auto a = make_allocator();
  fake().hold_events(true);
  void* x = a->allocate(4 * MiB, stream(1));
  void* y = a->allocate(4 * MiB, stream(1));
  a->record_stream(y, stream(2));
  a->deallocate(y, stream(1));  // pending on stream 2
  a->deallocate(x, stream(1));  // free, must not swallow y
  void* big = a->allocate(8 * MiB, stream(1));
  EXPECT_NE(big, x);
  fake().complete_events();
  a->deallocate(big, stream(1));
  EXPECT_EQ(a->allocate(8 * MiB, stream(1)), x);  // merged after the event
}

// The free is done for the caller (the pointer is no longer live, stats count
// it freed) even though the allocator could not record its event.
void expect_freed(const CachingAllocator& a, void* p) {
  EXPECT_FALSE(a.is_allocation(p));
  auto st = a.stats();
  EXPECT_EQ(st.active_blocks.current, 0);
  EXPECT_EQ(st.allocated_bytes.current, 0);
  EXPECT_EQ(st.requested_bytes.current, 0);
  EXPECT_EQ(st.frees, 1u);
}

// A failed cuEventRecord or cuEventCreate reports the error and keeps the
// block out of the pool; the next allocation retries the event and the
// block comes back once it completes.
class FailedEventTest : public FakeDriverTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(FailedEventTest, KeepsTheBlockAndRetries) {
  const char* call = GetParam();
  auto a = make_allocator();
  fake().hold_events(true);
  void* p = a->allocate(4096, stream(1));
  a->record_stream(p, stream(2));
  fake().fail(call, CUDA_ERROR_INVALID_VALUE);
  expect_error<cuda_error>([&] { a->deallocate(p, stream(1)); }, call);
  expect_freed(*a, p);
  EXPECT_THROW(a->deallocate(p, stream(1)), logic_error);  // freed once, not twice
  void* q = a->allocate(4096, stream(1));
  EXPECT_NE(q, p) << "reused while stream 2 may still use it";
  fake().complete_events();
  void* r = a->allocate(4096, stream(1));
  EXPECT_EQ(r, p) << "the block was lost";
  a->deallocate(q, stream(1));
  a->deallocate(r, stream(1));
  EXPECT_EQ(a->empty_cache(), 2 * MiB);
  EXPECT_EQ(a->stats().segments.current, 0);
}

INSTANTIATE_TEST_SUITE_P(EachEventCall, FailedEventTest, ::testing::Values("cuEventRecord", "cuEventCreate"),
                         [](const auto& info) { return std::string(info.param); });

// With two streams to wait for and only the second event failing, the first
// event completing must not return the block: stream 3 may still use it.
TEST_F(StreamOrderingTest, PartlyRecordedFreeWaitsForEveryStream) {
  auto a = make_allocator();
  fake().hold_events(true);
  void* p = a->allocate(4096, stream(1));
  a->record_stream(p, stream(2));
  a->record_stream(p, stream(3));
  fake().fail("cuEventRecord", CUDA_ERROR_INVALID_VALUE, 1, /*skip=*/1);
  expect_error<cuda_error>([&] { a->deallocate(p, stream(1)); }, "cuEventRecord");
  expect_freed(*a, p);
  fake().complete_events();  // the one event that was recorded
  void* q = a->allocate(4096, stream(1));
  EXPECT_NE(q, p) << "reused before stream 3's work was waited for";
  fake().complete_events();
  void* r = a->allocate(4096, stream(1));
  EXPECT_EQ(r, p);
  a->deallocate(q, stream(1));
  a->deallocate(r, stream(1));
}

// While events cannot be recorded, empty_cache reports it and keeps the block;
// once the driver recovers it waits for the block and releases its segment.
TEST_F(StreamOrderingTest, EmptyCacheReportsAnEventThatStillFails) {
  auto a = make_allocator();
  void* p = a->allocate(4096, stream(1));
  fake().fail("cuEventRecord", CUDA_ERROR_INVALID_VALUE, 2);
  expect_error<cuda_error>([&] { a->deallocate(p, stream(2)); }, "cuEventRecord");
  expect_freed(*a, p);
  expect_error<cuda_error>([&] { a->empty_cache(); }, "cuEventRecord");
  EXPECT_EQ(a->stats().segments.current, 1);
  EXPECT_EQ(a->empty_cache(), 2 * MiB);
  EXPECT_EQ(a->stats().segments.current, 0);
  EXPECT_EQ(a->stats().reserved_bytes.current, 0);
}

// An allocator destroyed while a free still waits for an event it could not
// record leaves nothing behind in the driver.
TEST_F(StreamOrderingTest, DestroyedWithAnUnrecordedFreeLeavesNothing) {
  auto a = make_allocator();
  void* p = a->allocate(4096, stream(1));
  void* other = a->allocate(4096, stream(1));
  a->record_stream(other, stream(2));
  fake().hold_events(true);
  a->deallocate(other, stream(1));  // one event recorded and held
  fake().fail("cuEventRecord", CUDA_ERROR_INVALID_VALUE, 1000);
  fake().fail("cuEventSynchronize", CUDA_ERROR_INVALID_VALUE, 1000);
  expect_error<cuda_error>([&] { a->deallocate(p, stream(2)); }, "cuEventRecord");
}

}  // namespace symmpool::test
