#include "fake_fixture.hpp"

namespace symmpool::test {

using StreamOrderingTest = FakeDriverTest;

TEST_F(StreamOrderingTest, FreedBlockIsReusedOnItsOwnStreamAtOnce) {
  {
    auto a = make_allocator();
    void* p = a->allocate(4096, stream(1));
    a->deallocate(p, stream(1));
    EXPECT_EQ(a->allocate(4096, stream(1)), p);
    EXPECT_EQ(fake().count("cuEventRecord"), 0u);  // no cross-stream use, no event
  }
  expect_driver_clean();
}

TEST_F(StreamOrderingTest, OtherStreamsNeverGetAnotherStreamsBlock) {
  {
    auto a = make_allocator();
    void* p = a->allocate(4096, stream(1));
    a->deallocate(p, stream(1));
    void* q = a->allocate(4096, stream(2));
    EXPECT_NE(q, p);
    EXPECT_EQ(a->stats().segments.current, 2);
    a->deallocate(q, stream(2));
  }
  expect_driver_clean();
}

TEST_F(StreamOrderingTest, RecordStreamDelaysReuseUntilTheEventCompletes) {
  {
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
  expect_driver_clean();
}

TEST_F(StreamOrderingTest, FreeOnAnotherStreamWaitsForThatStream) {
  {
    auto a = make_allocator();
    fake().hold_events(true);
    void* p = a->allocate(4096, stream(1));
    a->deallocate(p, stream(3));
    EXPECT_EQ(fake().count("cuEventRecord"), 1u);
    EXPECT_NE(a->allocate(4096, stream(1)), p);
    fake().complete_events();
    EXPECT_EQ(a->allocate(4096, stream(1)), p);
  }
  expect_driver_clean();
}

TEST_F(StreamOrderingTest, EmptyCacheWaitsForPendingFrees) {
  {
    auto a = make_allocator();
    fake().hold_events(true);
    void* p = a->allocate(4096, stream(1));
    a->record_stream(p, stream(2));
    a->deallocate(p, stream(1));
    EXPECT_EQ(a->empty_cache(), 2 * MiB);  // synchronized on the event, then released
    EXPECT_GE(fake().count("cuEventSynchronize"), 1u);
    EXPECT_EQ(a->stats().segments.current, 0);
  }
  expect_driver_clean();
}

TEST_F(StreamOrderingTest, PendingBlocksDoNotMergeEarly) {
  {
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
  expect_driver_clean();
}

}  // namespace symmpool::test
