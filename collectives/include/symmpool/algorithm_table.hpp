#pragma once
// Which engine runs a collective the "symm" backend could run itself, and
// which symmpool algorithm runs it. Entries come from measurements
// (bench/results/collectives_h200x2_2026-11-22*.json, 2x H200, bf16, busbw): symmpool
// where it beat NCCL or matched it within 5% while using no SM, NCCL
// everywhere else. World sizes not measured yet go to NCCL. Choices depend
// only on the op, the size and the world size, so every rank makes the same.

#include <symmpool/collective_types.hpp>

#include <cstddef>

namespace symmpool {

enum class CollectiveKind { kAllGather, kReduceScatter, kAllReduce };
enum class Engine { kSymmpool, kNccl };

inline constexpr std::size_t kMiB = std::size_t{1} << 20;

// `bytes`: all-gather output, reduce-scatter input, all-reduce buffer.
constexpr Engine choose_engine(CollectiveKind op, std::size_t bytes, int world) {
  if (world != 2) return Engine::kNccl;  // only 2 GPUs measured so far
  switch (op) {
    case CollectiveKind::kAllGather:  // copy engines: within 3% of NCCL from 64 MiB, no SM
      return bytes >= 64 * kMiB ? Engine::kSymmpool : Engine::kNccl;
    case CollectiveKind::kReduceScatter:  // 1.09x NCCL at 4 MiB .. 1.25x at 1 GiB
    case CollectiveKind::kAllReduce:      // 1.19x at 4 MiB, parity at 1 GiB
      return bytes >= 4 * kMiB ? Engine::kSymmpool : Engine::kNccl;
  }
  return Engine::kNccl;
}

// Same `bytes` as choose_engine.
constexpr Algorithm choose_algorithm(CollectiveKind op, std::size_t bytes, int world) {
  (void)world;
  switch (op) {
    case CollectiveKind::kAllGather:  // kernel 109 vs pull 71 GB/s at 4 MiB; push 306 vs pull 295 at 256 MiB
      return bytes <= 16 * kMiB ? Algorithm::kKernel : Algorithm::kCopyEnginePush;
    case CollectiveKind::kReduceScatter:
      return Algorithm::kOneShot;
    case CollectiveKind::kAllReduce:  // two-shot 75 vs one-shot 64 GB/s at 1 MiB
      return bytes <= 256 * 1024 ? Algorithm::kOneShot : Algorithm::kTwoShot;
  }
  return Algorithm::kOneShot;
}

// Reduction kernels that read at most this much from each peer meet their
// peers inside (one launch); bigger ones are bracketed by barrier kernels.
constexpr bool fused_kernel(std::size_t bytes_per_peer) { return bytes_per_peer <= 1 * kMiB; }

}  // namespace symmpool
