#include "fake_fixture.hpp"

#include <symmpool/device_allocators.hpp>
#include <symmpool/error.hpp>

namespace symmpool::test {

// The process-wide allocators, made on the fake driver for the test.
class DeviceAllocatorsTest : public FakeDriverTest {
 protected:
  void SetUp() override {
    FakeDriverTest::SetUp();
    symmpool::testing::set_device_allocator_driver(&fake().api());
  }
  void TearDown() override {
    symmpool::testing::destroy_device_allocators();
    symmpool::testing::set_device_allocator_driver(nullptr);
    FakeDriverTest::TearDown();
  }
};

TEST_F(DeviceAllocatorsTest, AskingForAnExistingAllocatorNeverMakesOne) {
  for (int d = 0; d < 64; ++d) EXPECT_EQ(existing_device_allocator(d), nullptr) << d;
  EXPECT_TRUE(fake().calls().empty()) << "the query reached the driver";
  EXPECT_EQ(fake().live_reservations(), 0u);
  EXPECT_THROW(existing_device_allocator(-1), logic_error);
  EXPECT_THROW(existing_device_allocator(64), logic_error);
}

TEST_F(DeviceAllocatorsTest, ExistingAllocatorIsTheOneInUse) {
  CachingAllocator& a = device_allocator(1);
  EXPECT_EQ(existing_device_allocator(1), &a);
  EXPECT_EQ(&device_allocator(1), &a);
  EXPECT_EQ(existing_device_allocator(0), nullptr) << "device 0 was never used";
  EXPECT_EQ(fake().count("cuDevicePrimaryCtxRetain"), 1u);  // device 1's only
  void* p = a.allocate(4096, stream(1));
  free_on_device(p, 4096, 1, stream(1));
  symmpool::testing::destroy_device_allocators();
  EXPECT_EQ(existing_device_allocator(1), nullptr);
}

}  // namespace symmpool::test
