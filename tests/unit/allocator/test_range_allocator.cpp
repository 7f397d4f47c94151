#include <symmpool/detail/range_allocator.hpp>

#include <gtest/gtest.h>

using symmpool::detail::RangeAllocator;

TEST(RangeAllocator, FirstFitLowestAddress) {
  RangeAllocator r(100);
  EXPECT_EQ(r.allocate(10), 0u);
  EXPECT_EQ(r.allocate(20), 10u);
  EXPECT_EQ(r.allocate(30), 30u);
  r.release(10, 20);
  EXPECT_EQ(r.allocate(5), 10u);   // the hole, not the tail
  EXPECT_EQ(r.allocate(40), 60u);  // does not fit the 15-byte hole
  EXPECT_FALSE(r.allocate(1000).has_value());
}

TEST(RangeAllocator, MergesNeighbours) {
  RangeAllocator r(90);
  auto a = *r.allocate(30), b = *r.allocate(30), c = *r.allocate(30);
  r.release(a, 30);
  r.release(c, 30);
  EXPECT_EQ(r.free_range_count(), 2u);
  r.release(b, 30);
  EXPECT_EQ(r.free_range_count(), 1u);
  EXPECT_EQ(r.allocate(90), 0u);
}

TEST(RangeAllocator, SameRequestsGiveSameOffsets) {
  // SPMD ranks replaying one sequence must agree on every offset.
  auto replay = [] {
    RangeAllocator r(1 << 20);
    std::vector<std::size_t> offsets;
    for (std::size_t i = 1; i <= 50; ++i) {
      offsets.push_back(*r.allocate(i * 64));
      if (i % 3 == 0) r.release(offsets[i - 2], (i - 1) * 64);
    }
    return offsets;
  };
  EXPECT_EQ(replay(), replay());
}
