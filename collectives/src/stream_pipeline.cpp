#include "stream_pipeline.hpp"

#include <symmpool/error.hpp>

#include <string>

namespace symmpool::detail {

namespace {

cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  SYMMPOOL_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

// `waiter` waits for `event` as last recorded: a wait enqueued before the
// event's next record, so each of the events below is only ever waited on
// for the piece that recorded it.
void follow(cudaStream_t waiter, cudaEvent_t event, cudaStream_t recorder) {
  SYMMPOOL_CUDA_TRY(cudaEventRecord(event, recorder));
  SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(waiter, event, 0));
}

}  // namespace

StreamPipeline::StreamPipeline() {
  SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&pull_stream_, cudaStreamNonBlocking));
  SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&push_stream_, cudaStreamNonBlocking));
  fork_ = new_event();
  pushed_ = new_event();
  for (int i = 0; i < kMaxSlots; ++i) {
    pulled_[i] = new_event();
    reduced_[i] = new_event();
  }
}

StreamPipeline::~StreamPipeline() {
  cudaStreamDestroy(pull_stream_);
  cudaStreamDestroy(push_stream_);
  cudaEventDestroy(fork_);
  cudaEventDestroy(pushed_);
  for (int i = 0; i < kMaxSlots; ++i) {
    cudaEventDestroy(pulled_[i]);
    cudaEventDestroy(reduced_[i]);
  }
}

void StreamPipeline::run(int pieces, int slots, cudaStream_t stream, const Stage& pull, const Stage& reduce,
                         const Stage& push) {
  SYMMPOOL_EXPECTS(slots >= 1 && slots <= kMaxSlots, "symmpool: a stream pipeline takes 1 to " +
                                                         std::to_string(kMaxSlots) + " slots, got " +
                                                         std::to_string(slots));
  if (pieces <= 0) return;
  SYMMPOOL_CUDA_TRY(cudaEventRecord(fork_, stream));
  SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(pull_stream_, fork_, 0));
  if (push) SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(push_stream_, fork_, 0));
  for (int k = 0; k < pieces; ++k) {
    const int slot = k % slots;
    // The slot's last reader is the reduce of piece k - slots, whose record
    // of reduced_[slot] is the latest one (piece k's comes below).
    if (k >= slots) SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(pull_stream_, reduced_[slot], 0));
    pull(k, slot, pull_stream_);
    follow(stream, pulled_[slot], pull_stream_);
    reduce(k, slot, stream);
    if (push) {
      follow(push_stream_, reduced_[slot], stream);
      push(k, slot, push_stream_);
    } else {
      SYMMPOOL_CUDA_TRY(cudaEventRecord(reduced_[slot], stream));
    }
  }
  // Pulls are joined already: the last reduce waited for the last pull.
  if (push) follow(stream, pushed_, push_stream_);
}

}  // namespace symmpool::detail
