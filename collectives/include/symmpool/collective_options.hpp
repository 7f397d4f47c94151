#pragma once
// A communicator's settings from the environment, read once and handed to
// its constructor (docs/usage.md, Collectives):
//   SYMMPOOL_MAX_BLOCKS       grid cap of the reductions too large to meet
//                             their peers inside (as NCCL_MAX_CTAS caps NCCL's)
//   SYMMPOOL_COPY_STREAMS     streams that share each copy-engine copy
//   SYMMPOOL_BARRIER_TIMEOUT  seconds any barrier waits for a peer; overrides
//                             the timeout the caller gives the communicator
//   SYMMPOOL_ALL_REDUCE_ALGORITHM  one-shot, two-shot, two-step or
//                             low-latency: the all-reduce algorithm wherever
//                             it can run, in place of the table's (as NCCL_ALGO)
//   SYMMPOOL_REDUCE_SCATTER_ALGORITHM  one-shot or two-step: the same for
//                             reduce-scatters
//   SYMMPOOL_TWO_STEP_PIECE_BYTES  the most the two-step algorithms move and
//                             reduce per pipeline step, of one rank's chunk
//                             (a chunk is cut into two pieces at least)
//   SYMMPOOL_FUSED_MAX_BYTES  the most a reduction kernel reads from each
//                             peer and still meets its peers inside; larger
//                             ones run between barrier kernels, whose grid
//                             SYMMPOOL_MAX_BLOCKS caps (default: the table's
//                             fused_kernel_limit). Equal on every rank.

#include <symmpool/collective_types.hpp>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

namespace symmpool {

// The collectives' environment variables as written; CollectiveOptions::from
// checks them (an empty field: the variable is unset).
struct CollectiveEnvironment {
  // SYMMPOOL_MAX_BLOCKS: cap on the grid of reduction kernels too large to
  // meet their peers inside (they hold SMs that overlapping compute wants),
  // as NCCL_MAX_CTAS caps NCCL's.
  std::string max_blocks;
  // SYMMPOOL_COPY_STREAMS: streams that share each copy-engine copy (1..8).
  std::string copy_streams;
  // SYMMPOOL_BARRIER_TIMEOUT: seconds a barrier waits for a peer before it
  // gives up with an error (default 600, c10d's default for NCCL).
  std::string barrier_timeout;
  // SYMMPOOL_ALL_REDUCE_ALGORITHM: one-shot, two-shot, two-step or
  // low-latency, used where it can run instead of the algorithm table's
  // choice (as NCCL_ALGO); SYMMPOOL_REDUCE_SCATTER_ALGORITHM: one-shot or
  // two-step, the same for reduce-scatters.
  std::string all_reduce_algorithm;
  std::string reduce_scatter_algorithm;
  // SYMMPOOL_TWO_STEP_PIECE_BYTES: the most bytes of one rank's chunk that
  // the two-step algorithms move and reduce per pipeline step.
  std::string two_step_piece_bytes;
  // SYMMPOOL_FUSED_MAX_BYTES: the most bytes a reduction kernel reads from
  // each peer and still meets its peers inside one launch; larger ones run
  // between barrier kernels (the algorithm table's limit when unset).
  std::string fused_max_bytes;

  static CollectiveEnvironment from_process();
};

struct CollectiveOptions {
  // 2 ranks, a 256 MiB reduce-scatter under 8 matmuls
  // (bench/results/collectives_grid_cap_h200x2_2026-11-22.json): the whole grid
  // (528 blocks) was fastest alone but slowed the matmuls most; 64 blocks kept
  // most of its bandwidth, above NCCL's, and slowed them no more than NCCL
  // did; 32 blocks lost much of it.
  static constexpr int kDefaultMaxBlocks = 64;
  static constexpr int kLargestGrid = 65535;
  static constexpr int kDefaultCopyStreams = 1;
  static constexpr int kMostCopyStreams = 8;
  static constexpr std::chrono::seconds kLongestBarrierTimeout{86400};
  // A piece long enough that a copy's start-up is small beside it, short
  // enough that the pipeline fills quickly; staging holds 3 pieces per peer
  // (96 MiB at 2 ranks, 672 MiB at 8: two-step is opt-in until measured).
  // The all-reduce's best cap at 64 MiB, 256 MiB and 1 GiB on 2 ranks among
  // 4-32 MiB, read under the half-chunk rule from runs made before it; the
  // reduce-scatter's best was 32 MiB at 1 GiB but 8 MiB at 64 and 256 MiB
  // (bench/results/collectives_h200x2_2026-11-24_two-step-pieces-and-low-latency.json,
  // one run each). The variable is there to sweep it.
  static constexpr int kDefaultTwoStepPieceBytes = 32 << 20;
  static constexpr int kSmallestTwoStepPieceBytes = 64 << 10;
  static constexpr int kLargestTwoStepPieceBytes = 256 << 20;
  static constexpr std::size_t kLargestFusedMaxBytes = 0x7fffffff;

  int max_blocks = kDefaultMaxBlocks;      // 1 to kLargestGrid
  int copy_streams = kDefaultCopyStreams;  // 1 (the caller's stream alone) to kMostCopyStreams
  // Set: replaces the barrier timeout the communicator is given (1 s to kLongestBarrierTimeout).
  std::optional<std::chrono::seconds> barrier_timeout;
  // Set: all-reduces that name no algorithm use this one where it can run
  // (one-shot, two-shot, two-step or low-latency), the table's choice elsewhere.
  std::optional<Algorithm> all_reduce_algorithm;
  // The same for reduce-scatters (one-shot or two-step).
  std::optional<Algorithm> reduce_scatter_algorithm;
  int two_step_piece_bytes = kDefaultTwoStepPieceBytes;  // kSmallest.. to kLargestTwoStepPieceBytes
  // Set: reduction kernels reading at most this many bytes from each peer
  // meet their peers inside, larger ones run between barrier kernels, in
  // place of the table's fused_kernel_limit (0 to kLargestFusedMaxBytes;
  // 0: always between barriers). Must be equal on every rank.
  std::optional<std::size_t> fused_max_bytes;

  // Parses env's variables; an unset one keeps its default, a bad one
  // raises logic_error naming the variable and the value.
  static CollectiveOptions from(const CollectiveEnvironment& env);
  // from(CollectiveEnvironment::from_process()): what a communicator takes by default.
  static CollectiveOptions from_environment();

  // Raises logic_error if a field is out of its range (options set in code;
  // from() never returns such).
  void check() const;
};

}  // namespace symmpool
