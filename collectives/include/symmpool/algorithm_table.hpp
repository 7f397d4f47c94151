#pragma once
// Which engine runs a collective the "symm" backend could run itself.
// Entries come from measurements (bench/results/collectives_h200x2_2026-11-22.json,
// 2x H200, bf16, busbw): symmpool where it beat NCCL or matched it within 5%
// while using no SM, NCCL everywhere else. World sizes not measured yet go
// to NCCL. The choice depends only on the op, the size and the world size,
// so every rank makes the same one.

#include <cstddef>

namespace symmpool {

enum class CollectiveKind { kAllGather, kReduceScatter, kAllReduce };
enum class Engine { kSymmpool, kNccl };

// `bytes`: all-gather output, reduce-scatter input, all-reduce buffer.
constexpr Engine choose_engine(CollectiveKind op, std::size_t bytes, int world) {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  if (world != 2) return Engine::kNccl;  // only 2 GPUs measured so far
  switch (op) {
    case CollectiveKind::kAllGather:  // copy engines: within 3% of NCCL from 64 MiB, no SM
      return bytes >= 64 * MiB ? Engine::kSymmpool : Engine::kNccl;
    case CollectiveKind::kReduceScatter:  // 1.09x NCCL at 4 MiB .. 1.25x at 1 GiB
    case CollectiveKind::kAllReduce:      // 1.19x at 4 MiB, parity at 1 GiB
      return bytes >= 4 * MiB ? Engine::kSymmpool : Engine::kNccl;
  }
  return Engine::kNccl;
}

}  // namespace symmpool
