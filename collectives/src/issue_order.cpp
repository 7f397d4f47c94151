#include "issue_order.hpp"

#include <symmpool/error.hpp>

namespace symmpool::detail {

namespace {

// The capture `stream` belongs to, or 0 outside captures (ids start at 1).
unsigned long long capture_of(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  SYMMPOOL_CUDA_TRY(cudaStreamGetCaptureInfo(stream, &status, &id));
  return status == cudaStreamCaptureStatusActive ? id : 0;
}

}  // namespace

IssueOrder::IssueOrder() {
  SYMMPOOL_CUDA_TRY(cudaEventCreateWithFlags(&eager_, cudaEventDisableTiming));
  SYMMPOOL_CUDA_TRY(cudaEventCreateWithFlags(&captured_, cudaEventDisableTiming));
}

IssueOrder::~IssueOrder() {
  cudaEventDestroy(eager_);
  cudaEventDestroy(captured_);
}

unsigned long long IssueOrder::begin(cudaStream_t stream) {
  const unsigned long long capture = capture_of(stream);
  // A stream runs its own work in order: only a change of stream needs the
  // wait (cudaStreamPerThread names a different stream in each thread).
  const bool same_stream = stream == eager_stream_ && stream != cudaStreamPerThread;
  if (capture == 0 && eager_recorded_ && !same_stream)
    SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(stream, eager_, 0));
  if (capture != 0 && capture == capture_id_) SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(stream, captured_, 0));
  return capture;
}

void IssueOrder::end(cudaStream_t stream, unsigned long long capture) {
  if (capture == 0) {
    SYMMPOOL_CUDA_TRY(cudaEventRecord(eager_, stream));
    eager_recorded_ = true;
    eager_stream_ = stream;
  } else {
    SYMMPOOL_CUDA_TRY(cudaEventRecord(captured_, stream));
    capture_id_ = capture;
  }
}

}  // namespace symmpool::detail
