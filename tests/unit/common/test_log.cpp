#include <symmpool/error.hpp>
#include <symmpool/log.hpp>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace symmpool::test {

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log::set_sink([this](const std::string& line) { lines_.push_back(line); });
  }
  void TearDown() override {
    log::set_sink({});
    log::set_filter(log::Level::kWarn, log::kAll);
    log::set_rank(-1);
  }
  std::vector<std::string> lines_;
};

TEST_F(LogTest, ParsesLevelsAndSubsystemsAsNcclDoes) {
  EXPECT_EQ(log::parse_level("info"), log::Level::kInfo);
  EXPECT_EQ(log::parse_level("TRACE"), log::Level::kTrace);
  EXPECT_EQ(log::parse_level("none"), log::Level::kNone);
  EXPECT_EQ(log::parse_subsystems("heap,REG"), unsigned(log::kHeap | log::kReg));
  EXPECT_EQ(log::parse_subsystems("^ROUTING"), ~unsigned(log::kRouting));
  EXPECT_EQ(log::parse_subsystems("ALL"), unsigned(log::kAll));
  EXPECT_THROW(log::parse_level("LOUD"), logic_error);
  EXPECT_THROW(log::parse_subsystems("HEAP,GPU"), logic_error);
}

TEST_F(LogTest, WritesWhatTheFilterLetsThroughWithItsPrefix) {
  log::set_filter(log::Level::kInfo, log::kHeap | log::kRouting);
  log::set_rank(3);
  SYMMPOOL_INFO(kHeap, "mapped %d segments", 2);
  SYMMPOOL_TRACE(kHeap, "not at INFO");
  SYMMPOOL_WARN(kAlloc, "not in a subsystem asked for");
  SYMMPOOL_WARN(kRouting, "a warning of %s", "ROUTING");
  ASSERT_EQ(lines_.size(), 2u);
  EXPECT_NE(lines_[0].find(" [rank 3] symmpool INFO HEAP mapped 2 segments"), std::string::npos) << lines_[0];
  EXPECT_NE(lines_[1].find(" [rank 3] symmpool WARN ROUTING a warning of ROUTING"), std::string::npos)
      << lines_[1];
  log::set_filter(log::Level::kNone, log::kAll);
  SYMMPOOL_WARN(kColl, "silenced");
  EXPECT_EQ(lines_.size(), 2u);
}

}  // namespace symmpool::test
