#include "stream_pipeline.hpp"

#include <symmpool/detail/scope_exit.hpp>
#include <symmpool/error.hpp>

#include <string>

namespace symmpool::detail {

namespace {

// `waiter` waits for `event` as last recorded: a wait enqueued before the
// event's next record, so each of the events below is only ever waited on
// for the piece that recorded it.
void follow(cudaStream_t waiter, cudaEvent_t event, cudaStream_t recorder) {
  SYMMPOOL_CUDA_TRY(cudaEventRecord(event, recorder));
  SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(waiter, event, 0));
}

}  // namespace

StreamPipeline::StreamPipeline() {
  for (int i = 0; i < kMaxSlots; ++i) {
    pulled_[i] = new_event();
    reduced_[i] = new_event();
  }
}

void StreamPipeline::run(int pieces, int slots, cudaStream_t stream, const Stage& pull, const Stage& reduce,
                         const Stage& push) {
  SYMMPOOL_EXPECTS(slots >= 1 && slots <= kMaxSlots, "symmpool: a stream pipeline takes 1 to " +
                                                         std::to_string(kMaxSlots) + " slots, got " +
                                                         std::to_string(slots));
  if (pieces <= 0) return;
  cudaStream_t pull_stream = pull_.get(), push_stream = push_.get();
  SYMMPOOL_CUDA_TRY(cudaEventRecord(fork_.get(), stream));
  SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(pull_stream, fork_.get(), 0));
  SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(push_stream, fork_.get(), 0));
  // From here on both side streams are forked: join them back whatever
  // happens (an unjoined fork would also spoil a capture), best effort
  // when a stage failed.
  ScopeExit join_after_failure([&] {
    for (cudaStream_t side : {pull_stream, push_stream})
      if (cudaEventRecord(joined_.get(), side) == cudaSuccess)
        (void)cudaStreamWaitEvent(stream, joined_.get(), 0);
  });
  for (int k = 0; k < pieces; ++k) {
    const int slot = k % slots;
    cudaEvent_t pulled = pulled_[slot].get(), reduced = reduced_[slot].get();
    // The slot's last reader is the reduce of piece k - slots, whose record
    // of reduced[slot] is the latest one (piece k's comes below).
    if (k >= slots) SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(pull_stream, reduced, 0));
    pull(k, slot, pull_stream);
    follow(stream, pulled, pull_stream);
    reduce(k, slot, stream);
    if (push) {
      follow(push_stream, reduced, stream);
      push(k, slot, push_stream);
    } else {
      SYMMPOOL_CUDA_TRY(cudaEventRecord(reduced, stream));
    }
  }
  // The pull stream is joined already (the last reduce waited for the last
  // pull); the push stream, even when it had nothing to do.
  follow(stream, pushed_.get(), push_stream);
  join_after_failure.dismiss();
}

}  // namespace symmpool::detail
