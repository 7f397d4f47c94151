// The stream-op watchdog's decision per channel and tick, without a GPU:
// a wait is timed from when its stream reaches it (as a kernel's wait is),
// progress restarts the clock, and a failed communicator lets every wait
// issued pass, again at every tick until they have.

#include "stream_op_watchdog.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace symmpool::test {

using detail::ChannelClock;
using detail::ChannelVerdict;
using detail::judge_channel;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr seconds kTimeout{5};
const auto t0 = std::chrono::steady_clock::time_point{} + seconds(1000);

ChannelVerdict tick(ChannelClock& clock, std::uint32_t issued, std::uint32_t reached, std::uint32_t passed,
                    std::chrono::steady_clock::duration at, bool failed = false) {
  return judge_channel(clock, issued, reached, passed, failed, t0 + at, kTimeout);
}

TEST(StreamOpWatchdog, AWaitItsStreamHasNotReachedIsNeverTimedOut) {
  // Issued at t0 behind other work: the host ran ahead; the peer may be
  // waiting for a signal queued behind that work (it was blamed before).
  ChannelClock clock;
  for (int s = 0; s <= 60; s += 5) EXPECT_EQ(tick(clock, 1, 0, 0, seconds(s)), ChannelVerdict::kWaiting) << s;
}

TEST(StreamOpWatchdog, AStreamSittingInAWaitTimesOutAfterTheTimeoutFromWhenItGotThere) {
  ChannelClock clock;
  EXPECT_EQ(tick(clock, 1, 0, 0, seconds(0)), ChannelVerdict::kWaiting);
  EXPECT_EQ(tick(clock, 1, 1, 0, seconds(30)), ChannelVerdict::kWaiting);  // the GPU got there at 30 s
  EXPECT_EQ(tick(clock, 1, 1, 0, seconds(34) + milliseconds(950)), ChannelVerdict::kWaiting);
  EXPECT_EQ(tick(clock, 1, 1, 0, seconds(35)), ChannelVerdict::kTimedOut);
  EXPECT_EQ(tick(clock, 1, 1, 0, seconds(35) + milliseconds(50)), ChannelVerdict::kWaiting) << "blamed twice";
}

TEST(StreamOpWatchdog, ProgressRestartsTheClock) {
  ChannelClock clock;
  EXPECT_EQ(tick(clock, 3, 1, 0, seconds(0)), ChannelVerdict::kWaiting);
  EXPECT_EQ(tick(clock, 3, 2, 1, seconds(4)), ChannelVerdict::kWaiting);  // the first passed
  EXPECT_EQ(tick(clock, 3, 2, 1, seconds(8)), ChannelVerdict::kWaiting);
  EXPECT_EQ(tick(clock, 3, 2, 1, seconds(9)), ChannelVerdict::kTimedOut);
}

TEST(StreamOpWatchdog, AChannelWhoseWaitsAllPassedIsIdle) {
  ChannelClock clock;
  for (int s = 0; s <= 60; s += 5) EXPECT_EQ(tick(clock, 7, 7, 7, seconds(s)), ChannelVerdict::kWaiting);
  // New waits after a long idle time get a full timeout.
  EXPECT_EQ(tick(clock, 8, 8, 7, seconds(61)), ChannelVerdict::kWaiting);
  EXPECT_EQ(tick(clock, 8, 8, 7, seconds(65)), ChannelVerdict::kWaiting);
  EXPECT_EQ(tick(clock, 8, 8, 7, seconds(66)), ChannelVerdict::kTimedOut);
}

TEST(StreamOpWatchdog, AFailedCommunicatorReleasesEveryWaitIssuedAtEveryTickUntilTheyPass) {
  // Waits for 2 and 3 issued, the first not yet reached: both go, whether
  // or not the GPU got there (before, only those up to the first stalled one).
  // And again at the next tick: a peer's stream that reached the meeting
  // after the release wrote its own value over it, and with a digest below
  // ours a checked meeting's wait held the stream for good (a review of
  // c60bb3d found it; the release was once per batch).
  ChannelClock clock;
  EXPECT_EQ(tick(clock, 3, 1, 1, seconds(0), true), ChannelVerdict::kRelease);
  EXPECT_EQ(tick(clock, 3, 2, 1, milliseconds(50), true), ChannelVerdict::kRelease);
  EXPECT_EQ(tick(clock, 4, 2, 2, milliseconds(100), true), ChannelVerdict::kRelease);  // a new wait
  EXPECT_EQ(tick(clock, 4, 4, 4, milliseconds(150), true), ChannelVerdict::kWaiting);  // all passed
}

TEST(StreamOpWatchdog, CountsThatWrapAroundAreTimedLikeAnyOther) {
  ChannelClock clock;
  EXPECT_EQ(tick(clock, 0, 0, 0xffffffffu, seconds(0)), ChannelVerdict::kWaiting);
  EXPECT_EQ(tick(clock, 0, 0, 0xffffffffu, seconds(5)), ChannelVerdict::kTimedOut);
  ChannelClock idle;
  EXPECT_EQ(tick(idle, 0, 0, 0, seconds(100)), ChannelVerdict::kWaiting);
}

}  // namespace symmpool::test
