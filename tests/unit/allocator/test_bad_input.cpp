#include "fake_fixture.hpp"

#include <symmpool/error.hpp>

#include <cstdint>

namespace symmpool::test {

using BadInputTest = FakeDriverTest;

TEST_F(BadInputTest, ZeroBytesGivesNullAndFreeingNullIsANoOp) {
  auto a = make_allocator();
  EXPECT_EQ(a->allocate(0, stream(1)), nullptr);
  a->deallocate(nullptr, stream(1));
  EXPECT_EQ(a->stats().allocations, 0u);
  EXPECT_EQ(fake().count("cuMemCreate"), 0u);
}

TEST_F(BadInputTest, AbsurdSizesAreRejected) {
  auto a = make_allocator();
  expect_error<logic_error>([&] { a->allocate(SIZE_MAX, stream(1)); }, "more than device 0's total memory");
  expect_error<logic_error>([&] { a->allocate((1u << 30) + 1, stream(1)); }, "total memory");
  EXPECT_EQ(fake().count("cuMemCreate"), 0u);
}

TEST_F(BadInputTest, ForeignPointersDoubleFreesAndInteriorPointers) {
  auto a = make_allocator();
  int on_stack = 0;
  expect_error<logic_error>([&] { a->deallocate(&on_stack, stream(1)); }, "not allocated by symmpool");
  void* p = a->allocate(4096, stream(1));
  void* keep = a->allocate(4096, stream(1));
  expect_error<logic_error>([&] { a->deallocate(static_cast<char*>(p) + 16, stream(1)); },
                            "not the start of an allocation");
  a->deallocate(p, stream(1));
  expect_error<logic_error>([&] { a->deallocate(p, stream(1)); }, "already freed (double free?)");
  expect_error<logic_error>([&] { a->record_stream(p, stream(2)); }, "already freed");
  expect_error<logic_error>([&] { a->allocation_size(p); }, "already freed");
  a->deallocate(keep, stream(1));
  EXPECT_EQ(a->stats().frees, 2u);
}

TEST_F(BadInputTest, SizeMismatchOnFreeIsRejected) {
  auto a = make_allocator();
  void* p = a->allocate(1000, stream(1));
  expect_error<logic_error>([&] { a->deallocate(p, 999, stream(1)); }, "allocated with size 1000");
  EXPECT_TRUE(a->is_allocation(p));  // the failed free changed nothing
  a->deallocate(p, 1000, stream(1));
}

TEST_F(BadInputTest, UnknownDeviceIsRejected) {
  expect_error<logic_error>([&] { make_allocator(2); }, "device 2 is not a CUDA device");
}

TEST_F(BadInputTest, DriverFailureCarriesCallAndErrorString) {
  auto a = make_allocator();
  fake().fail("cuMemMap", CUDA_ERROR_INVALID_VALUE);
  try {
    a->allocate(4096, stream(1));
    FAIL() << "expected cuda_error";
  } catch (const cuda_error& e) {
    EXPECT_EQ(e.code(), CUDA_ERROR_INVALID_VALUE);
    EXPECT_NE(std::string(e.what()).find("cuMemMap"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fake().live_handles(), 0u);
  EXPECT_NE(a->allocate(4096, stream(1)), nullptr);  // and it recovers
}

// A (fake) device as large as size_t can count, so the total-memory check lets
// sizes near SIZE_MAX through to the rounding, which must not wrap to a small
// size. The virtual range is given explicitly: twice SIZE_MAX cannot be reserved.
class HugeDeviceTest : public FakeDriverTest {
 protected:
  FakeDeviceConfig config() override {
    FakeDeviceConfig c;
    c.total_memory = SIZE_MAX;
    return c;
  }
  std::unique_ptr<CachingAllocator> make_huge_allocator() {
    ArenaOptions options;
    options.env = {};
    options.va_reserve_bytes = 64 * MiB;
    return std::make_unique<CachingAllocator>(std::make_unique<SegmentArena>(fake().api(), 0, options));
  }
};

TEST_F(HugeDeviceTest, SizesNearSizeMaxDoNotWrapWhenRounded) {
  auto a = make_huge_allocator();
  // Rounding to the 512-byte block size overflows.
  expect_error<logic_error>([&] { a->allocate(SIZE_MAX, stream(1)); }, "allocation of");
  expect_error<logic_error>([&] { a->allocate(SIZE_MAX - 100, stream(1)); }, "overflows size_t");
  // A multiple of 512 whose rounding to the 2 MiB large-segment size overflows.
  expect_error<logic_error>([&] { a->allocate(SIZE_MAX - 511, stream(1)); }, "overflows size_t");
  EXPECT_EQ(fake().count("cuMemCreate"), 0u);
  EXPECT_EQ(a->stats().allocations, 0u);
  // Half of size_t rounds fine and is simply more than the device can map.
  expect_error<out_of_memory>([&] { a->allocate(SIZE_MAX / 2, stream(1)); }, "tried to allocate");
  expect_error<out_of_memory>([&] { a->allocate(SIZE_MAX / 2 + 2, stream(1)); }, "tried to allocate");
  EXPECT_EQ(a->stats().segments.current, 0);
  void* p = a->allocate(4096, stream(1));  // and the allocator still works
  EXPECT_NE(p, nullptr);
  a->deallocate(p, stream(1));
}

TEST_F(HugeDeviceTest, HugeVirtualRangeRequestIsRejected) {
  for (std::size_t bytes : {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 2 * MiB + 2}) {
    ArenaOptions options;
    options.env = {};
    options.va_reserve_bytes = bytes;
    expect_error<logic_error>([&] { SegmentArena arena(fake().api(), 0, options); },
                              "virtual range reservation of");
  }
  EXPECT_EQ(fake().count("cuMemAddressReserve"), 0u);
}

// A device whose memory, doubled for the default virtual range, overflows.
class TooLargeToDoubleTest : public FakeDriverTest, public ::testing::WithParamInterface<std::size_t> {
 protected:
  FakeDeviceConfig config() override {
    FakeDeviceConfig c;
    c.total_memory = GetParam();
    return c;
  }
};

TEST_P(TooLargeToDoubleTest, DeviceTooLargeToDoubleIsReported) {
  expect_error<out_of_memory>([&] { make_allocator(); }, "twice that does not fit");
  EXPECT_EQ(fake().count("cuMemAddressReserve"), 0u);
}

INSTANTIATE_TEST_SUITE_P(HugeDevice, TooLargeToDoubleTest,
                         ::testing::Values(SIZE_MAX, SIZE_MAX / 2 + 1, SIZE_MAX / 2));

}  // namespace symmpool::test
