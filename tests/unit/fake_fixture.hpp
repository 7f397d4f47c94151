#pragma once
// Test fixture: a fresh fake driver per test and allocators built on it.

#include <symmpool/caching_allocator.hpp>
#include <symmpool/testing/fake_driver.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace symmpool::test {

using testing::FakeDeviceConfig;
using testing::FakeDriver;

inline CUstream stream(int n) { return reinterpret_cast<CUstream>(static_cast<std::uintptr_t>(n)); }

// Position of the first call named `name` at or after `from` in a fake
// driver's log (calls.size() when there is none).
inline std::size_t index_of(const std::vector<std::string>& calls, const std::string& name,
                            std::size_t from = 0) {
  auto it = std::find(calls.begin() + static_cast<std::ptrdiff_t>(from), calls.end(), name);
  return static_cast<std::size_t>(it - calls.begin());
}

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

// Runs `f` and checks it throws E whose text contains `needle`.
template <typename E, typename F>
void expect_error(F f, const std::string& needle) {
  try {
    f();
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

class FakeDriverTest : public ::testing::Test {
 protected:
  static constexpr int kDevices = 2;  // fake GPUs in every test

  void SetUp() override { fake().reset(kDevices, config()); }
  virtual FakeDeviceConfig config() { return {}; }

  static FakeDriver& fake() { return FakeDriver::instance(); }

  // An allocator with a clean environment, so the test's result does not
  // depend on the variables of the shell that runs it.
  std::unique_ptr<CachingAllocator> make_allocator(int device = 0, bool multicast = false,
                                                   Environment env = {}) {
    ArenaOptions options;
    options.multicast_requested = multicast;
    options.env = env;
    return std::make_unique<CachingAllocator>(std::make_unique<SegmentArena>(fake().api(), device, options),
                                              env.segment_moves);
  }

  // Every test ends with the fake driver clean: what the test made (its
  // allocators, arenas, hooks) is gone by now and must have given back every
  // handle, mapping, reservation, event and NCCL registration. A subclass
  // that overrides TearDown calls this one last.
  void TearDown() override {
    if (!IsSkipped()) expect_driver_clean();
  }

  // The same check, for a test that resets the fake part way (each reset
  // drops what was left), before it does.
  static void expect_driver_clean() {
    const std::string test = current_test_name();
    EXPECT_EQ(fake().live_handles(), 0u) << "handles left by " << test;
    EXPECT_EQ(fake().live_mappings(), 0u) << "mappings left by " << test;
    EXPECT_EQ(fake().live_reservations(), 0u) << "reservations left by " << test;
    EXPECT_EQ(fake().live_events(), 0u) << "events left by " << test;
    EXPECT_EQ(fake().live_nccl_registrations(), 0u) << "NCCL registrations left by " << test;
    for (int d = 0; d < kDevices; ++d)
      EXPECT_EQ(fake().used_memory(d), 0u) << "device " << d << " memory left by " << test;
  }

  static std::string current_test_name() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return info ? std::string(info->test_suite_name()) + "." + info->name() : "(no test)";
  }
};

// A fake device of 8 GiB, for the randomized tests: their live sets peak
// near 1-2 GiB.
class LargeFakeDeviceTest : public FakeDriverTest {
 protected:
  FakeDeviceConfig config() override {
    FakeDeviceConfig c;
    c.total_memory = std::size_t{8} << 30;
    return c;
  }
};

}  // namespace symmpool::test
