#include "cuda_handles.hpp"

#include <symmpool/error.hpp>

namespace symmpool::detail {

UniqueStream new_stream() {
  cudaStream_t s = nullptr;
  SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return UniqueStream(s);
}

UniqueEvent new_event() {
  cudaEvent_t e = nullptr;
  SYMMPOOL_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return UniqueEvent(e);
}

}  // namespace symmpool::detail
