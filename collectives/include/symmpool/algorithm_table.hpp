#pragma once
// Which engine runs a collective the "symm" backend could run itself, and
// which symmpool algorithm runs it. Entries come from measurements (bf16,
// eager 64 KiB..1 GiB and 8 KiB..8 MiB in CUDA graphs, NCCL on the same
// buffers); world sizes not measured go to NCCL. scripts/table_from_bench.py
// derives an entry from a benchmark file (tests/python/test_table_from_bench.py
// checks the entries below against the files they cite). "(uncapped grid)": from
// collectives_h200x2_2026-11-22_uncapped-grid.json, before the 64-block cap.
// Choices depend only on the op, the size and the world size, so every rank
// makes the same. Not on the dtype: at 2 ranks fp32 reductions win and lose
// at the same sizes as bf16 (collectives_dtype_h200x2_2026-11-22.json), and
// fp16 runs bf16's kernels. The figures live in the files cited (bench/results/)
// and docs/results.md; the comments here say which comparison each choice rests on.

#include <symmpool/collective_types.hpp>

#include <array>
#include <cstddef>
#include <limits>

namespace symmpool {

enum class CollectiveKind { kAllGather, kReduceScatter, kAllReduce };
// symmpool's own kernels; NCCL on buffers in NCCL's symmetric windows (its
// symmetric kernels, checked first: collective_routing.hpp); NCCL on memory
// outside any window.
enum class Engine { kSymmpool, kNcclWindows, kNccl };

inline constexpr std::size_t kMiB = std::size_t{1} << 20;
// Where the table picks the low-latency all-reduce: up to its limit
// (Communicator::kLowLatencyMaxBytes; a slot too small for it falls back to two-shot).
inline constexpr std::size_t kLowLatencyTableBytes = 128 * 1024;
inline constexpr std::size_t kAnySize = std::numeric_limits<std::size_t>::max();

// The largest size of each op that symmpool runs at one world size.
struct SymmpoolLimits {
  int world;
  std::size_t all_gather, reduce_scatter, all_reduce;
};

inline constexpr SymmpoolLimits kMeasuredLimits[] = {
    // peers_h200x2_2026-11-27_fused-reductions-every-size.json (bench/peers, 1 KiB-1 GiB,
    // eager and graph), symmpool against NCCL on the same registered buffers:
    // symmpool ahead for every op from the smallest size to 1 GiB, the
    // all-reduce too once 256 MiB and up ran in one kernel of 128 blocks
    // (before, 1 GiB went to NCCL: collectives_h200x2_2026-11-22_final-defaults.json).
    {2, kAnySize, kAnySize, kAnySize},
    // collectives_h200x4_2026-11-22_first-run.json, symmpool against NCCL: the
    // all-gather ahead at every size, the reduce-scatter ahead or even; the
    // all-reduce ahead up to 16 MiB, behind from 64 MiB.
    {4, kAnySize, kAnySize, 16 * kMiB},
};

// Sizes at which NCCL's symmetric kernels, on windows, beat symmpool's own
// kernels at one world size, eager or in a CUDA graph: each entry comes from
// a peer-benchmark file with "nccl-window" rows beside symmpool's (bench/peers),
// [min_bytes, max_bytes] in choose_engine's bytes.
struct NcclWindowRange {
  CollectiveKind op;
  int world;
  bool captured;
  std::size_t min_bytes, max_bytes;
};

// None yet: "nccl-window" has been measured on one GPU only (a group of one
// rank, where NCCL copies), which says nothing of peers. A measured entry
// routes its calls to NCCL's windows wherever the buffers lie in them.
inline constexpr std::array<NcclWindowRange, 0> kMeasuredNcclWindowRanges{};
using NcclWindowRanges = decltype(kMeasuredNcclWindowRanges);

// Whether any entry names `world` (the router asks the stream's capture
// state only then).
template <typename Ranges = NcclWindowRanges>
constexpr bool has_nccl_window_ranges(int world, const Ranges& ranges = kMeasuredNcclWindowRanges) {
  for (const NcclWindowRange& r : ranges)
    if (r.world == world) return true;
  return false;
}

// `bytes`: all-gather output, reduce-scatter input, all-reduce buffer.
// `captured`: the call goes into a CUDA graph.
template <typename Ranges = NcclWindowRanges>
constexpr Engine choose_engine(CollectiveKind op, std::size_t bytes, int world, bool captured = false,
                               const Ranges& window_ranges = kMeasuredNcclWindowRanges) {
  for (const NcclWindowRange& r : window_ranges)
    if (r.op == op && r.world == world && r.captured == captured && bytes >= r.min_bytes &&
        bytes <= r.max_bytes)
      return Engine::kNcclWindows;
  for (const SymmpoolLimits& l : kMeasuredLimits) {
    if (l.world != world) continue;
    const std::size_t limit = op == CollectiveKind::kAllGather       ? l.all_gather
                              : op == CollectiveKind::kReduceScatter ? l.reduce_scatter
                                                                     : l.all_reduce;
    return bytes <= limit ? Engine::kSymmpool : Engine::kNccl;
  }
  return Engine::kNccl;
}

// Same `bytes` as choose_engine.
constexpr Algorithm choose_algorithm(CollectiveKind op, std::size_t bytes, int world) {
  switch (op) {
    // The kernel up to 16 MiB, copy-engine push above: at 2 ranks the kernel
    // led at 16 MiB and push at 64 MiB (uncapped grid); at 4 ranks the kernel
    // led at 16 MiB and push at 256 MiB. 8 loads in flight a thread made the
    // kernel faster at 16 MiB eager and at 4 MiB in a graph
    // (peers_h200x2_2026-11-27_gather-unroll-and-fused-4m.json, 2 rounds each).
    case CollectiveKind::kAllGather:
      return bytes <= 16 * kMiB ? Algorithm::kKernel : Algorithm::kCopyEnginePush;
    // One-shot. Two-step (copy engines pull, a local reduce; 32 MiB pieces) was
    // slower at 256 MiB and only a little faster at 1 GiB on 2 ranks
    // (peers_h200x2_2026-11-26_unrolled-reduce.json), slowed 8192^3 matmuls
    // beside it less but was itself slowed more (contention_h200x2_2026-11-26.json),
    // and with it above 64 MiB FSDP2 at 3.5B batch 2 showed more exposed
    // communication for the same step ratio to stock and more peak memory
    // (fsdp2_h200x2_2026-11-26_two-step-table.json); on wide4b batch 1 its step
    // matched one-shot's (..._wide4b-b1s512-rs-two-step.json vs
    // -rs-one-shot.json, one machine).
    // 4 ranks: one-shot beat two-step with 8 MiB pieces at every size.
    case CollectiveKind::kReduceScatter:
      return Algorithm::kOneShot;
    // 2 ranks, in a CUDA graph: low-latency ahead of two-shot and of NCCL at 1,
    // 8 and 32 KiB, same process and buffers, by more than runs vary
    // (collectives_h200x2_2026-11-24_two-step-pieces-and-low-latency.json,
    // one run); 4 ranks: not measured. Up to 128 KiB (64 blocks) it stayed
    // ahead of two-shot and of torch's best, 2 interleaved rounds
    // (peers_h200x2_2026-11-27_low-latency-up-to-128k.json; its slot holds 248 KiB a
    // rank at 2 ranks, so 256 KiB stays two-shot).
    // In place, 2 ranks: two-shot ahead of one-shot at 8 KiB and at 1 GiB
    // (uncapped grid); 4 ranks: two-shot won at every size.
    case CollectiveKind::kAllReduce:
      // Not two-step, though at 2 ranks it was faster than two-shot at
      // 256 MiB and slowed matmuls beside it less
      // (contention_h200x2_2026-11-26.json): its copies still run after a
      // failed barrier, writing into peers' outputs, where two-shot leaves
      // them alone, and its staging (up to 96 MiB) is taken at the first
      // call, where running out of memory fails the group.
      if (world == 2 && bytes <= kLowLatencyTableBytes) return Algorithm::kLowLatency;
      return Algorithm::kTwoShot;  // (all_reduce falls back to one-shot where two-shot cannot run)
  }
  return Algorithm::kOneShot;
}

// Reduction kernels that read at most this much from each peer meet their
// peers inside (one launch, the grid below whatever SYMMPOOL_MAX_BLOCKS
// says); bigger ones are bracketed by barrier kernels. SYMMPOOL_FUSED_MAX_BYTES
// replaces the limit. At 2 ranks the one kernel won up to 8 MiB a peer once
// it kept 8 loads in flight a thread
// (peers_h200x2_2026-11-27_gather-unroll-and-fused-4m.json,
// ..._fused-4m-at-6-and-8-mib.json), up to 16 MiB with 64 meeting blocks
// instead of 32 (..._sync64-and-fused-every-size.json), and at every size
// measured, 16-256 MiB calls, with 128 blocks for the all-reduce and 64 for
// the reduce-scatter: in every round, eager, the one kernel's slowest ahead
// of the barrier kernels' fastest, and the all-reduce ahead of torch's
// two-shot too (peers_h200x2_2026-11-27_fused-large-reductions-64-vs-128-blocks.json;
// tests/python/test_table_from_bench.py derives the limit from the file).
// Other world sizes are not measured with it and keep 1 MiB.
constexpr std::size_t fused_kernel_limit(int world) { return world == 2 ? kAnySize : 1 * kMiB; }
// The grid of a reduction kernel that meets its peers inside (at most
// detail::kMaxSyncBlocks): 128 blocks for the two-shot all-reduce, 64 for
// the one-shot, FSDP2's reduce-scatter, which overlaps the backward's
// matmuls: 128 gained it nothing in the file above, and each block is an
// SM the matmuls lose. The all-reduce's 128 do cost overlapping matmuls:
// they slowed more beside a 256 MiB two-shot than beside one between
// barrier kernels on 64
// (contention_h200x2_2026-11-27_fused-reductions-128-vs-bracketed-64.json).
inline constexpr int kTwoShotFusedBlocks = 128;
inline constexpr int kOneShotFusedBlocks = 64;
constexpr bool fused_kernel(std::size_t bytes_per_peer, int world) {
  return bytes_per_peer <= fused_kernel_limit(world);
}

}  // namespace symmpool
