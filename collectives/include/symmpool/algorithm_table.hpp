#pragma once
// Which engine runs a collective the "symm" backend could run itself, and
// which symmpool algorithm runs it. Entries come from measurements
// (bench/results/collectives_h200x2_2026-11-22c.json, 2x H200, bf16): at 2
// ranks symmpool matched or beat NCCL at every size measured (64 KiB..1 GiB
// eager, 8 KiB..8 MiB in graphs); world sizes not measured yet go to NCCL.
// Choices depend only on the op, the size and the world size, so every rank
// makes the same.

#include <symmpool/collective_types.hpp>

#include <cstddef>

namespace symmpool {

enum class CollectiveKind { kAllGather, kReduceScatter, kAllReduce };
enum class Engine { kSymmpool, kNccl };

inline constexpr std::size_t kMiB = std::size_t{1} << 20;

// `bytes`: all-gather output, reduce-scatter input, all-reduce buffer.
constexpr Engine choose_engine(CollectiveKind op, std::size_t bytes, int world) {
  (void)op;
  (void)bytes;
  // 2 ranks, symmpool / NCCL: AG 64 KiB 7.1/8.5 us, 1 GiB 324/316 GB/s;
  // RS 64 KiB 7.4/8.6 us, 1 GiB 331/262 GB/s; AR in place 64 KiB 7.5/8.8 us,
  // 1 GiB 335/330 GB/s.
  return world == 2 ? Engine::kSymmpool : Engine::kNccl;
}

// Same `bytes` as choose_engine.
constexpr Algorithm choose_algorithm(CollectiveKind op, std::size_t bytes, int world) {
  (void)world;
  switch (op) {
    case CollectiveKind::kAllGather:  // kernel 202 vs push 178 GB/s at 16 MiB; push 252 vs kernel 221 at 64 MiB
      return bytes <= 16 * kMiB ? Algorithm::kKernel : Algorithm::kCopyEnginePush;
    case CollectiveKind::kReduceScatter:  // one-shot 274 vs two-step 223 GB/s at 64 MiB
      return Algorithm::kOneShot;
    case CollectiveKind::kAllReduce:  // in place, two-shot 5.7 vs one-shot 6.7 us at 8 KiB, 335 vs 288 GB/s at 1 GiB
      return Algorithm::kTwoShot;     // (all_reduce falls back to one-shot where two-shot cannot run)
  }
  return Algorithm::kOneShot;
}

// Reduction kernels that read at most this much from each peer meet their
// peers inside (one launch); bigger ones are bracketed by barrier kernels.
constexpr bool fused_kernel(std::size_t bytes_per_peer) { return bytes_per_peer <= 1 * kMiB; }

}  // namespace symmpool
