#include "fake_fixture.hpp"

#include <symmpool/error.hpp>

namespace symmpool::test {

using BadInputTest = FakeDriverTest;

// Runs `f` and checks it throws logic_error whose text contains `needle`.
template <typename F>
void expect_logic_error(F f, const std::string& needle) {
  try {
    f();
    FAIL() << "expected logic_error containing '" << needle << "'";
  } catch (const logic_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(BadInputTest, ZeroBytesGivesNullAndFreeingNullIsANoOp) {
  {
    auto a = make_allocator();
    EXPECT_EQ(a->allocate(0, stream(1)), nullptr);
    a->deallocate(nullptr, stream(1));
    EXPECT_EQ(a->stats().allocations, 0u);
    EXPECT_EQ(fake().count("cuMemCreate"), 0u);
  }
  expect_driver_clean();
}

TEST_F(BadInputTest, AbsurdSizesAreRejected) {
  {
    auto a = make_allocator();
    expect_logic_error([&] { a->allocate(SIZE_MAX, stream(1)); }, "more than device 0's total memory");
    expect_logic_error([&] { a->allocate((1u << 30) + 1, stream(1)); }, "total memory");
    EXPECT_EQ(fake().count("cuMemCreate"), 0u);
  }
  expect_driver_clean();
}

TEST_F(BadInputTest, ForeignPointersDoubleFreesAndInteriorPointers) {
  {
    auto a = make_allocator();
    int on_stack = 0;
    expect_logic_error([&] { a->deallocate(&on_stack, stream(1)); }, "not allocated by symmpool");
    void* p = a->allocate(4096, stream(1));
    void* keep = a->allocate(4096, stream(1));
    expect_logic_error([&] { a->deallocate(static_cast<char*>(p) + 16, stream(1)); },
                       "not the start of an allocation");
    a->deallocate(p, stream(1));
    expect_logic_error([&] { a->deallocate(p, stream(1)); }, "already freed (double free?)");
    expect_logic_error([&] { a->record_stream(p, stream(2)); }, "already freed");
    expect_logic_error([&] { a->allocation_size(p); }, "already freed");
    a->deallocate(keep, stream(1));
    EXPECT_EQ(a->stats().frees, 2u);
  }
  expect_driver_clean();
}

TEST_F(BadInputTest, SizeMismatchOnFreeIsRejected) {
  {
    auto a = make_allocator();
    void* p = a->allocate(1000, stream(1));
    expect_logic_error([&] { a->deallocate(p, 999, stream(1)); }, "allocated with size 1000");
    EXPECT_TRUE(a->is_allocation(p));  // the failed free changed nothing
    a->deallocate(p, 1000, stream(1));
  }
  expect_driver_clean();
}

TEST_F(BadInputTest, UnknownDeviceIsRejected) {
  expect_logic_error([&] { make_allocator(2); }, "device 2 is not a CUDA device");
  expect_driver_clean();
}

TEST_F(BadInputTest, DriverFailureCarriesCallAndErrorString) {
  {
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
  expect_driver_clean();
}

}  // namespace symmpool::test
