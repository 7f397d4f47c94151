// The digest a call's first meeting compares across ranks (call_check.hpp):
// alike for alike calls, apart for another call number, operation, buffer
// offset or size, handed to the first meeting only.

#include "call_check.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <set>

namespace symmpool::test {

namespace {

std::uint32_t digest(std::uint64_t number, const char* op, std::size_t offset, std::size_t bytes) {
  detail::CallCheck check;
  check.begin(number, op);
  check.add_buffer(offset, bytes);
  return check.take();
}

}  // namespace

TEST(CallCheck, AlikeCallsGiveOneDigestAndAnyDifferenceAnother) {
  const std::uint32_t base = digest(7, "all_reduce", 4096, 1024);
  EXPECT_EQ(digest(7, "all_reduce", 4096, 1024), base);
  std::set<std::uint32_t> seen{base};
  for (std::uint32_t other : {digest(8, "all_reduce", 4096, 1024), digest(7, "all_gather", 4096, 1024),
                              digest(7, "all_reduce", 8192, 1024), digest(7, "all_reduce", 4096, 2048)})
    EXPECT_TRUE(seen.insert(other).second) << other;
}

TEST(CallCheck, OnlyTheFirstMeetingTakesTheDigestAndItIsNeverZero) {
  detail::CallCheck check;
  EXPECT_EQ(check.take(), 0u);  // no call begun
  for (std::uint64_t number = 1; number <= 10000; ++number) {
    check.begin(number, "barrier");
    EXPECT_NE(check.take(), 0u) << number;
    EXPECT_EQ(check.take(), 0u) << number;
  }
}

TEST(CallCheck, BuffersCountInTheOrderGiven) {
  detail::CallCheck ab, ba;
  ab.begin(1, "all_reduce");
  ab.add_buffer(0, 64);
  ab.add_buffer(4096, 64);
  ba.begin(1, "all_reduce");
  ba.add_buffer(4096, 64);
  ba.add_buffer(0, 64);
  EXPECT_NE(ab.take(), ba.take());  // input and output swapped is another call
}

}  // namespace symmpool::test
