#pragma once
// Which engine runs a collective the "symm" backend could run itself, and
// which symmpool algorithm runs it. Entries come from measurements
// (bench/results/collectives_h200x2_2026-11-22d.json, 2x H200, bf16): at 2
// ranks symmpool beat NCCL at every size measured (64 KiB..1 GiB eager,
// 8 KiB..8 MiB in graphs) but the 1 GiB all-reduce (321 vs 329 GB/s, with
// the default 64-block cap); world sizes not measured yet go to NCCL.
// "(run c)": from collectives_h200x2_2026-11-22c.json, before that cap.
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
  // 2 ranks, symmpool / NCCL: AG 64 KiB 7.1/9.7 us, 1 GiB 323/315 GB/s;
  // RS 64 KiB 7.3/10.1 us, 1 GiB 297/258 GB/s; AR in place 64 KiB 7.5/9.8 us,
  // 256 MiB 313/296 GB/s, 1 GiB 321/329 GB/s.
  return world == 2 ? Engine::kSymmpool : Engine::kNccl;
}

// Same `bytes` as choose_engine.
constexpr Algorithm choose_algorithm(CollectiveKind op, std::size_t bytes, int world) {
  (void)world;
  switch (op) {
    case CollectiveKind::kAllGather:  // kernel 202 vs push 178 GB/s at 16 MiB; push 252 vs kernel 221 at 64 MiB (run c)
      return bytes <= 16 * kMiB ? Algorithm::kKernel : Algorithm::kCopyEnginePush;
    case CollectiveKind::kReduceScatter:  // one-shot 297 vs two-step 216 GB/s at 1 GiB
      return Algorithm::kOneShot;
    case CollectiveKind::kAllReduce:  // in place, two-shot 5.7 vs one-shot 6.7 us at 8 KiB (run c), 321 vs 281 GB/s at 1 GiB
      return Algorithm::kTwoShot;     // (all_reduce falls back to one-shot where two-shot cannot run)
  }
  return Algorithm::kOneShot;
}

// Reduction kernels that read at most this much from each peer meet their
// peers inside (one launch); bigger ones are bracketed by barrier kernels.
constexpr bool fused_kernel(std::size_t bytes_per_peer) { return bytes_per_peer <= 1 * kMiB; }

}  // namespace symmpool
