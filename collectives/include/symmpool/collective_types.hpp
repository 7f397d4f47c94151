#pragma once
// Element types, reductions and algorithms the symmpool collectives support;
// anything else goes to NCCL.

#include <cstddef>
#include <string>

namespace symmpool {

enum class DataType { kFloat32, kFloat16, kBFloat16 };
enum class ReduceOp { kSum, kAvg };

inline std::size_t element_size(DataType t) { return t == DataType::kFloat32 ? 4 : 2; }
inline std::string to_string(DataType t) {
  return t == DataType::kFloat32 ? "float32" : t == DataType::kFloat16 ? "float16" : "bfloat16";
}

enum class BarrierKind {
  kKernel,     // one tiny kernel; safe inside CUDA graphs (its epoch lives on the device)
  kStreamOps,  // stream memory operations: no SM at all. A call's first meeting compares the
               // ranks' calls as a kernel does, but a call that differs is told only once the
               // barrier timeout is up. While a stream is captured into a graph, kKernel is
               // used instead (a host epoch would replay)
};

enum class Algorithm {
  kAuto,            // by op, size and world size (algorithm_table.hpp): equal on every rank
  kCopyEnginePull,  // all-gather: each rank's copy engines read the peers' inputs; no SM
  kCopyEnginePush,  // all-gather: each rank writes its input into every peer's output; no SM
  kKernel,          // all-gather: one kernel reads every peer, barriers inside (small messages)
  kOneShot,         // reduce-scatter, all-reduce: one kernel reads every peer's input
  kTwoShot,         // all-reduce: reduce our chunk, write it into every peer's output
  kTwoStep,         // reduce-scatter, all-reduce: copy engines pull our chunk from every peer, a
                    // local kernel reduces it (all-reduce: copy engines push it to every peer),
                    // pipelined piece by piece
  kLowLatency,      // all-reduce, small: inputs pushed as flagged packets, no barrier (NCCL's LL)
};
inline constexpr int kAlgorithmCount = static_cast<int>(Algorithm::kLowLatency) + 1;

// The algorithms that can run an all-reduce, and a reduce-scatter.
constexpr bool runs_all_reduce(Algorithm a) {
  return a == Algorithm::kOneShot || a == Algorithm::kTwoShot || a == Algorithm::kTwoStep ||
         a == Algorithm::kLowLatency;
}
constexpr bool runs_reduce_scatter(Algorithm a) {
  return a == Algorithm::kOneShot || a == Algorithm::kTwoStep;
}

inline const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kCopyEnginePull:
      return "copy-engine pull";
    case Algorithm::kCopyEnginePush:
      return "copy-engine push";
    case Algorithm::kKernel:
      return "kernel";
    case Algorithm::kOneShot:
      return "one-shot";
    case Algorithm::kTwoShot:
      return "two-shot";
    case Algorithm::kTwoStep:
      return "two-step";
    case Algorithm::kLowLatency:
      return "low-latency";
  }
  return "unknown";
}

}  // namespace symmpool
