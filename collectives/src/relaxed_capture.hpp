#pragma once
// While alive, lets this thread make setup calls (cudaMalloc, cudaHostAlloc,
// cuMemMap...) even if a stream is being captured into a CUDA graph, as
// PyTorch does for NCCL's setup under capture: none of them touches the
// capturing stream, but the default (global) capture mode forbids them.

#include <cuda_runtime_api.h>

namespace symmpool::detail {

class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&previous_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&previous_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace symmpool::detail
