#include "issue_order.hpp"

#include "capture_state.hpp"

#include <symmpool/error.hpp>

#include <utility>

namespace symmpool::detail {

unsigned long long IssueOrder::begin(cudaStream_t stream) {
  const unsigned long long capture = capture_of(stream);
  // A stream runs its own work in order: only a change of stream needs the
  // wait (cudaStreamPerThread names a different stream in each thread).
  const bool same_stream = stream == eager_stream_ && stream != cudaStreamPerThread;
  if (capture == 0 && !same_stream) {
    if (eager_call_ != 0)
      end_word_->make_wait(stream, eager_call_);
    else if (eager_)
      SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(stream, eager_.get(), 0));
  }
  if (capture != 0 && capture == capture_id_)
    SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(stream, captured_.get(), 0));
  return capture;
}

void IssueOrder::end(cudaStream_t stream, unsigned long long capture, SharedEvent done) {
  if (capture == 0) {
    eager_ = std::move(done);
    eager_call_ = 0;
    eager_stream_ = stream;
  } else {
    captured_ = std::move(done);
    capture_id_ = capture;
  }
}

void IssueOrder::end_at_word(cudaStream_t stream, std::uint64_t call) {
  eager_.reset();
  eager_call_ = call;
  eager_stream_ = stream;
}

}  // namespace symmpool::detail
