#pragma once
// One rank's allocator on its own fake driver, in a child of run_ranks.

#include "fake_fixture.hpp"

#include <symmpool/segment_arena.hpp>

#include <memory>

namespace symmpool::test {

inline std::unique_ptr<CachingAllocator> fake_allocator(int device) {
  FakeDriver::instance().reset(3);  // this process's own fake driver
  ArenaOptions options;
  options.env = Environment{};
  return std::make_unique<CachingAllocator>(
      std::make_unique<SegmentArena>(FakeDriver::instance().api(), device, options));
}

}  // namespace symmpool::test
