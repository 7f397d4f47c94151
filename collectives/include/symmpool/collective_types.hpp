#pragma once
// Element types and reductions the symmpool collectives support; anything
// else goes to NCCL.

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
  kStreamOps,  // cuStreamWriteValue32 / cuStreamWaitValue32: no SM at all; eager only
};

}  // namespace symmpool
