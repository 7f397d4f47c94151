// The failure monitor without a GPU (captured calls make no events): the
// collectives' numbers stay the same on every rank however many signals and
// waits each rank made; what the kernels report in the error words becomes
// an error naming the rank.

#include "failure_monitor.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace symmpool::test {

TEST(FailureMonitor, SignalsAndWaitsDoNotShiftTheCollectivesNumbers) {
  detail::ErrorWords words{};
  std::string handled;
  detail::FailureMonitor monitor(0, 0, 3, std::chrono::seconds(5), &words,
                                 [&](const std::string& message) { handled = message; });
  monitor.record("all_gather", 4096, nullptr, /*captured=*/true);
  // Rank 0 signals two peers (each waits once): its peers make one call, it makes two.
  monitor.record_point_to_point("signal", 1, nullptr, true);
  monitor.record_point_to_point("signal", 2, nullptr, true);
  monitor.record_point_to_point("wait", 1, nullptr, true);
  monitor.record("reduce_scatter", 4096, nullptr, true);
  EXPECT_EQ(monitor.issued(), 2u) << "signals and waits were counted as collectives";
  monitor.fail("test");
  EXPECT_NE(handled.find("failed after 2 collectives: test"), std::string::npos) << handled;
  EXPECT_EQ(words.missing, detail::kFailedOnHost);
  EXPECT_EQ(words.acknowledged, 1);
}

TEST(FailureMonitor, AKernelsReportOfADifferingCallNamesTheRank) {
  detail::ErrorWords words{};
  std::string handled;
  int handled_times = 0;
  detail::FailureMonitor monitor(0, 1, 4, std::chrono::seconds(5), &words, [&](const std::string& message) {
    handled = message;
    ++handled_times;
  });
  monitor.poll();
  EXPECT_EQ(handled_times, 0);
  words.differing = 3 + 1;  // as report_differing writes them: the rank first, then the code
  words.missing = detail::kCallsDiffer;
  monitor.poll();
  monitor.poll();
  EXPECT_EQ(handled_times, 1);
  EXPECT_NE(handled.find("on rank 1 of 4 failed: rank 3 is at another call, or passed symmetric buffers at "
                         "other offsets"),
            std::string::npos)
      << handled;
  EXPECT_EQ(words.acknowledged, 1);
  EXPECT_EQ(words.missing, detail::kCallsDiffer);
}

// A handler that throws still lets the stalled kernels go: every kernel
// that finds the failed word holds until `acknowledged` (394cca6), which was
// written only after the handler returned, so each queued kernel then
// waited out a whole barrier timeout. The failure stays on record and the
// handler's exception reaches the caller.
TEST(FailureMonitor, AHandlerThatThrowsStillAcknowledges) {
  detail::ErrorWords words{};
  int handled_times = 0;
  detail::FailureMonitor monitor(0, 0, 2, std::chrono::seconds(5), &words, [&](const std::string&) {
    ++handled_times;
    throw std::runtime_error("the handler failed");
  });
  EXPECT_THROW(monitor.fail_missing(1), std::runtime_error);
  EXPECT_EQ(words.acknowledged, 1) << "the kernels would hold until their timeout";
  EXPECT_EQ(words.missing, 2);
  EXPECT_TRUE(monitor.record_of_failure()->failed());
  monitor.poll();  // handled once: the record is set
  EXPECT_EQ(handled_times, 1);
}

}  // namespace symmpool::test
