#include "fake_fixture.hpp"

#include <symmpool/error.hpp>
#include <symmpool/segment_arena.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace symmpool::test {

using SegmentArenaTest = FakeDriverTest;

TEST_F(SegmentArenaTest, RoundsToGranularityAndMapsReadWrite) {
  SegmentArena arena(fake().api(), 0, ArenaOptions{false, 0, Environment{}});
  EXPECT_EQ(arena.granularity(), 2 * MiB);
  EXPECT_EQ(arena.va_reserved_bytes(), 2 * (1u << 30));  // twice the device memory
  const Segment* s = arena.map_new_segment(3 * MiB);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->size, 4 * MiB);
  EXPECT_EQ(s->address, arena.va_base() + s->offset);
  EXPECT_EQ(s->handle_types, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  std::memset(s->ptr(), 0xab, s->size);  // the fake backs it with memory
  EXPECT_EQ(static_cast<unsigned char*>(s->ptr())[s->size - 1], 0xab);
  EXPECT_EQ(arena.find(s->address + 5), s);
  EXPECT_EQ(arena.find(s->address + s->size), nullptr);
  EXPECT_EQ(fake().used_memory(0), 4 * MiB);
  EXPECT_EQ(fake().count("cuMemSetAccess"), 1u);
}

// Maps `segments` 2 MiB segments and destroys the arena while the first
// unmap fails (a sticky error at teardown); then undoes what the failure
// left (the fake keeps that segment mapped, so its range was not freed
// either). Returns the fake's calls made by the destruction.
std::vector<std::string> destroy_with_a_failing_unmap(int segments) {
  FakeDriver& fake = FakeDriver::instance();
  CUdeviceptr first = 0, base = 0;
  std::size_t reserved = 0;
  {
    SegmentArena arena(fake.api(), 0, ArenaOptions{false, 0, Environment{}});
    base = arena.va_base();
    reserved = arena.va_reserved_bytes();
    for (int i = 0; i < segments; ++i) {
      const Segment* segment = arena.map_new_segment(2 * MiB);
      EXPECT_NE(segment, nullptr);
      if (i == 0) first = segment->address;
    }
    fake.fail("cuMemUnmap", CUDA_ERROR_INVALID_VALUE);
    fake.clear_calls();
  }
  const std::vector<std::string> calls = fake.calls();
  EXPECT_EQ(fake.api().cuMemUnmap(first, 2 * MiB), CUDA_SUCCESS);
  EXPECT_EQ(fake.api().cuMemAddressFree(base, reserved), CUDA_SUCCESS);
  return calls;
}

// The destructor still tries every other segment. Before, it erased the
// next segment unmapped after a failure (unmap_segment had forgotten the
// failed one already).
TEST_F(SegmentArenaTest, DestroyingTriesEverySegmentWhenAnUnmapFails) {
  const std::vector<std::string> calls = destroy_with_a_failing_unmap(2);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "cuMemUnmap"), 2);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "cuMemRelease"), 2);
}

// Only the segment that failed to unmap is left: the destructor still ends.
// Before, it erased from an empty map and spun.
TEST_F(SegmentArenaTest, DestroyingEndsWhenTheLastUnmapFails) {
  const std::vector<std::string> calls = destroy_with_a_failing_unmap(1);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "cuMemUnmap"), 1);
}

TEST_F(SegmentArenaTest, OutOfMemoryReturnsNullAndLeavesNothing) {
  SegmentArena arena(fake().api(), 0, ArenaOptions{false, 0, Environment{}});
  EXPECT_EQ(arena.map_new_segment(2u << 30), nullptr);  // more than the device holds
  fake().fail("cuMemMap", CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(arena.map_new_segment(2 * MiB), nullptr);
  EXPECT_EQ(arena.segment_count(), 0u);
  EXPECT_EQ(fake().live_handles(), 0u);
  EXPECT_NE(arena.map_new_segment(2 * MiB), nullptr);  // the range went back too
}

// A parked range stays out of first-fit until it is released, even where
// the range has no room left without it: the allocator's retry after a
// full range releases it, at the same point on every rank.
TEST_F(SegmentArenaTest, ParkedRangesStayOutUntilReleased) {
  SegmentArena arena(fake().api(), 0, ArenaOptions{false, 0, Environment{}});
  const Segment* first = arena.map_new_segment(512 * MiB);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->offset, 0u);
  arena.unmap_segment(first, SegmentArena::RangeAfterUnmap::kPark);
  EXPECT_EQ(arena.parked_bytes(), 512 * MiB);
  EXPECT_EQ(fake().used_memory(0), 0u);  // the memory went back; only the range waits
  const Segment* second = arena.map_new_segment(512 * MiB);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->offset, 512 * MiB);
  arena.unmap_segment(second, SegmentArena::RangeAfterUnmap::kPark);
  EXPECT_EQ(arena.release_parked_ranges(), 1024 * MiB);
  EXPECT_EQ(arena.parked_bytes(), 0u);
  const Segment* third = arena.map_new_segment(512 * MiB);
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(third->offset, 0u);
  arena.unmap_segment(third, SegmentArena::RangeAfterUnmap::kPark);
  // Parked ranges fill the range (2 GiB less the internal slots at its top).
  for (int i = 0; i < 2; ++i) {
    const Segment* s = arena.map_new_segment(512 * MiB);
    ASSERT_NE(s, nullptr);
    arena.unmap_segment(s, SegmentArena::RangeAfterUnmap::kPark);
  }
  EXPECT_EQ(arena.parked_bytes(), 1536 * MiB);
  EXPECT_EQ(arena.map_new_segment(512 * MiB), nullptr);
  EXPECT_EQ(arena.release_parked_ranges(), 1536 * MiB);
  const Segment* again = arena.map_new_segment(512 * MiB);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->offset, 0u);
  arena.unmap_segment(again);
}

TEST_F(SegmentArenaTest, FailedStepThrowsNamingTheCallAndUndoes) {
  SegmentArena arena(fake().api(), 0, ArenaOptions{false, 0, Environment{}});
  fake().fail("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE);
  try {
    arena.map_new_segment(2 * MiB);
    FAIL() << "expected cuda_error";
  } catch (const cuda_error& e) {
    EXPECT_NE(std::string(e.what()).find("cuMemSetAccess"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("invalid argument"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fake().live_handles(), 0u);
  EXPECT_EQ(fake().live_mappings(), 0u);
}

TEST_F(SegmentArenaTest, RejectsDevicesThatDoNotExist) {
  EXPECT_THROW(SegmentArena(fake().api(), 7, ArenaOptions{false, 0, Environment{}}), logic_error);
  EXPECT_THROW(SegmentArena(fake().api(), -1, ArenaOptions{false, 0, Environment{}}), logic_error);
}

class FabricArenaTest : public FakeDriverTest {
 protected:
  FakeDeviceConfig config() override {
    FakeDeviceConfig c;
    c.fabric_supported = true;
    return c;
  }
};

TEST_F(FabricArenaTest, UsesFabricWhereSupportedAndFallsBack) {
  SegmentArena arena(fake().api(), 0, ArenaOptions{false, 0, Environment{}});
  const Segment* a = arena.map_new_segment(2 * MiB);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(a->handle_types & CU_MEM_HANDLE_TYPE_FABRIC);
  // A system that advertises fabric but refuses it (no IMEX channel).
  fake().fail("cuMemCreate", CUDA_ERROR_NOT_PERMITTED);
  const Segment* b = arena.map_new_segment(2 * MiB);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->handle_types, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

}  // namespace symmpool::test
