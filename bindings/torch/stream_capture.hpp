#pragma once
// Whether a torch stream is being captured into a CUDA graph: the c10d
// backend, the symmetric tensors and the fused ops each ask it.

#include <c10/cuda/CUDAStream.h>

namespace symmpool::torch_ext {

bool is_capturing(const c10::cuda::CUDAStream& stream);

}  // namespace symmpool::torch_ext
