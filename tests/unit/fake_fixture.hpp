#pragma once
// Test fixture: a fresh fake driver per test and allocators built on it.

#include <symmpool/caching_allocator.hpp>
#include <symmpool/testing/fake_driver.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

namespace symmpool::test {

using testing::FakeDeviceConfig;
using testing::FakeDriver;

inline CUstream stream(int n) { return reinterpret_cast<CUstream>(static_cast<std::uintptr_t>(n)); }

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

class FakeDriverTest : public ::testing::Test {
 protected:
  void SetUp() override { fake().reset(2, config()); }
  virtual FakeDeviceConfig config() { return {}; }

  static FakeDriver& fake() { return FakeDriver::instance(); }

  // An allocator with a clean environment, so the test's result does not
  // depend on the variables of the shell that runs it.
  std::unique_ptr<CachingAllocator> make_allocator(int device = 0, bool multicast = false,
                                                   Environment env = {}) {
    AllocatorOptions options;
    options.arena.multicast_requested = multicast;
    options.arena.env = env;
    return std::make_unique<CachingAllocator>(fake().api(), device, options);
  }

  static void expect_driver_clean() {
    EXPECT_EQ(fake().live_handles(), 0u);
    EXPECT_EQ(fake().live_mappings(), 0u);
    EXPECT_EQ(fake().live_reservations(), 0u);
    EXPECT_EQ(fake().live_events(), 0u);
    EXPECT_EQ(fake().used_memory(0), 0u);
  }
};

}  // namespace symmpool::test
