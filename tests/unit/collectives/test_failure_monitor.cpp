// The failure monitor's numbering, without a GPU (captured calls make no
// events): the collectives' numbers stay the same on every rank however
// many signals and waits each rank made.

#include "failure_monitor.hpp"

#include <gtest/gtest.h>

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
  EXPECT_EQ(words.missing, -1);
  EXPECT_EQ(words.acknowledged, 1);
}

}  // namespace symmpool::test
