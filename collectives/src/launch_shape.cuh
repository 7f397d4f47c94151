#pragma once
// What the kernels' launchers share: the block size, alignment checks, the
// grid for an amount of work, and the per-rank array size a kernel is
// instantiated for.

#include "kernels.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace symmpool::detail {

constexpr int kThreads = 512;

// Loads a thread keeps in flight in the reduce kernel's main loop: at
// kRanksCap ranks it takes kLoadsInFlight / kRanksCap vectors at a time.
// Peer loads are latency-bound: with one vector per thread, 64 blocks keep
// 512 KiB of peer reads in flight, too little to hide NVLink's latency; a
// large reduce-scatter ran well below the bare peer copy (docs/results.md,
// bench/results/peers_h200x2_2026-11-26_unrolled-reduce.json).
constexpr int kLoadsInFlight = 8;

template <int kRanksCap>
constexpr int kVectorsPerThread = kRanksCap >= kLoadsInFlight ? 1 : kLoadsInFlight / kRanksCap;

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0; }

inline int grid_for(std::size_t work, std::size_t cap) {
  const std::size_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<std::size_t>(1, std::min(blocks, cap)));
}

// Calls launch(std::integral_constant<int, cap>) with the smallest of 2, 4,
// kMaxRanks that is >= ranks: a kernel's per-rank arrays as small as the world
// allows, so more vectors are in flight per thread in the same registers.
template <typename Launch>
inline cudaError_t with_ranks_cap(int ranks, Launch&& launch) {
  if (ranks <= 2) return launch(std::integral_constant<int, 2>{});
  if (ranks <= 4) return launch(std::integral_constant<int, 4>{});
  return launch(std::integral_constant<int, kMaxRanks>{});
}

}  // namespace symmpool::detail
