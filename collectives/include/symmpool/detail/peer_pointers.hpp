#pragma once
// Per-rank device pointers handed to kernels by value.

#include <cstdint>

namespace symmpool::detail {

constexpr int kMaxRanks = 8;

struct PeerPointers {
  const void* ptr[kMaxRanks];
};

struct PadPointers {
  std::uint32_t* peer[kMaxRanks];  // each rank's signal pads, as mapped here
};

}  // namespace symmpool::detail
