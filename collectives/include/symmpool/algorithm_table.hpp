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
// fp16 runs bf16's kernels.

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
    // eager and graph), symmpool / NCCL on the same registered buffers: AG 64 KiB graph
    // 9.6/11.4 us, 1 GiB 1442/1677 us; RS 64 KiB graph 9.1/12.9 us, 1 GiB 1619/2035;
    // AR 64 KiB graph 10.8/12.8 us, 1 GiB 3165/3294 (at 256 MiB and up by one
    // kernel of 128 blocks; before, 1 GiB went to NCCL:
    // collectives_h200x2_2026-11-22_final-defaults.json, 321/329 GB/s).
    {2, kAnySize, kAnySize, kAnySize},
    // collectives_h200x4_2026-11-22_first-run.json, symmpool / NCCL: AG 64 KiB
    // 7.7/20.5 us, 1 GiB 2236/2340 us; RS 64 KiB 7.6/11.1 us, 1 GiB 2524/2523
    // (even); AR 16 MiB 92.9/96.9 us but 64 MiB 339/332, 1 GiB 5037/4577.
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
    // 2 ranks: kernel 202 vs push 178 GB/s at 16 MiB, push 252 vs kernel 221
    // at 64 MiB (uncapped grid); 4 ranks: kernel 46.8 vs push 65.1 us at 16 MiB, push
    // 598 vs kernel 647 us at 256 MiB. With 8 loads in flight a thread the kernel
    // took 38.1 vs 45.7 us at 16 MiB eager and 14.7 vs 16.6 at 4 MiB in a graph
    // (peers_h200x2_2026-11-27_gather-unroll-and-fused-4m.json, 2 rounds each).
    case CollectiveKind::kAllGather:
      return bytes <= 16 * kMiB ? Algorithm::kKernel : Algorithm::kCopyEnginePush;
    // One-shot. Two-step (copy engines pull, a local reduce; 32 MiB pieces) took
    // 449 vs 425 us at 256 MiB and 1576 vs 1627 at 1 GiB on 2 ranks
    // (peers_h200x2_2026-11-26_unrolled-reduce.json), slowed 8192^3 matmuls
    // beside it 2.2% against 7.4% but was itself slowed more (1.93x vs 1.75x
    // alone; contention_h200x2_2026-11-26.json), and with it above 64 MiB FSDP2
    // at 3.5B batch 2 showed more exposed communication (8.45 vs 6.66 ms) for
    // the same step ratio to stock (0.964x vs 0.966x) and 0.1 GiB more peak
    // (fsdp2_h200x2_2026-11-26_two-step-table.json); on wide4b batch 1 its step
    // matched one-shot's (89.2 vs 89.6 ms, ..._wide4b-b1s512-rs-two-step.json vs
    // -rs-one-shot.json, one machine).
    // 4 ranks: one-shot beat two-step with 8 MiB pieces at every size.
    case CollectiveKind::kReduceScatter:
      return Algorithm::kOneShot;
    // 2 ranks, in a CUDA graph: low-latency 2.92 / 3.55 / 3.72 us at 1 / 8 / 32 KiB
    // against two-shot's 4.89 / 5.19 / 5.66 and NCCL's 5.88 / 6.63 / 6.97, same
    // process and buffers (collectives_h200x2_2026-11-24_two-step-pieces-and-low-latency.json,
    // one run: 1.4-1.7x, beyond the 15% runs vary); 4 ranks: not measured. Up to
    // 128 KiB (64 blocks): 4.1-4.2 / 4.5-4.6 us at 64 / 128 KiB against two-shot's
    // 6.5-6.7 / 6.6-6.8 and torch's best 6.8-7.6 / 7.4-7.9, 2 interleaved rounds
    // (peers_h200x2_2026-11-27_low-latency-up-to-128k.json; its slot holds 248 KiB a
    // rank at 2 ranks, so 256 KiB stays two-shot).
    // In place, 2 ranks: two-shot 5.7 vs one-shot 6.7 us at 8 KiB (uncapped grid),
    // 321 vs 281 GB/s at 1 GiB; 4 ranks: two-shot won at every size.
    case CollectiveKind::kAllReduce:
      // Not two-step, though at 2 ranks it took 755 vs two-shot's 840 us at
      // 256 MiB and slowed matmuls beside it 2.3% against 12.3%
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
// the reduce-scatter
// (peers_h200x2_2026-11-27_fused-large-reductions-64-vs-128-blocks.json,
// 2 rounds, eager, us, one kernel / barrier kernels): all-reduce 64 MiB
// 209.6-210.6 / 221.4-221.9, 128 MiB 408.4-408.9 / 424.0-427.5, 256 MiB
// 799.8-804.3 / 831.8-834.3 (torch's two-shot 216.8-219.7, 417.4-425.6,
// 821.8-823.7); reduce-scatter 64 MiB 113.8-114.8 / 120.4-121.0, 128 MiB
// 214.7-218.7 / 222.4-224.9, 256 MiB 413.8-417.4 / 423.2-428.6
// (tests/python/test_table_from_bench.py derives the limit from the file).
// Other world sizes are not measured with it and keep 1 MiB.
constexpr std::size_t fused_kernel_limit(int world) { return world == 2 ? kAnySize : 1 * kMiB; }
// The grid of a reduction kernel that meets its peers inside (at most
// detail::kMaxSyncBlocks): 128 blocks for the two-shot all-reduce, 64 for
// the one-shot, FSDP2's reduce-scatter, which overlaps the backward's
// matmuls: 128 gained it nothing in the file above (64 MiB 115.3-122.0 us,
// 256 MiB 414.8-418.6), and each block is an SM the matmuls lose. The
// all-reduce's 128 do cost overlapping matmuls: 22.6-22.8% slower beside a
// 256 MiB two-shot against 10.3-11.0% between barrier kernels on 64
// (contention_h200x2_2026-11-27_fused-reductions-128-vs-bracketed-64.json).
inline constexpr int kTwoShotFusedBlocks = 128;
inline constexpr int kOneShotFusedBlocks = 64;
constexpr bool fused_kernel(std::size_t bytes_per_peer, int world) {
  return bytes_per_peer <= fused_kernel_limit(world);
}

}  // namespace symmpool
