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
  EXPECT_EQ(allocator_owning(p), &a);
  EXPECT_EQ(allocator_owning(static_cast<char*>(p) + 4096), &a) << "anywhere in its reserved range";
  int on_the_host = 0;
  EXPECT_EQ(allocator_owning(&on_the_host), nullptr);
  free_on_device(p, 4096, 1, stream(1));
  symmpool::testing::destroy_device_allocators();
  EXPECT_EQ(allocator_owning(p), nullptr) << "no allocator left";
  EXPECT_EQ(existing_device_allocator(1), nullptr);
}

TEST_F(DeviceAllocatorsTest, AFreeOnTheWrongDeviceNamesTheOwner) {
  void* p = device_allocator(1).allocate(4096, stream(1));
  device_allocator(0);
  try {
    free_on_device(p, 4096, 0, stream(1));
    FAIL() << "a free on the wrong device must raise";
  } catch (const logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("belongs to device 1"), std::string::npos) << e.what();
  }
  free_on_device(p, 4096, 1, stream(1));
  symmpool::testing::destroy_device_allocators();
}

}  // namespace symmpool::test
