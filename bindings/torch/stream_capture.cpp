#include "stream_capture.hpp"

#include <c10/cuda/CUDAException.h>

namespace symmpool::torch_ext {

bool is_capturing(const c10::cuda::CUDAStream& stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream.stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace symmpool::torch_ext
