#include "stream_pipeline.hpp"

#include <symmpool/detail/scope_exit.hpp>
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

void StreamPipeline::make(Lanes& lanes) {
  SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&lanes.pull, cudaStreamNonBlocking));
  SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&lanes.push, cudaStreamNonBlocking));
  lanes.fork = new_event();
  lanes.pulled_last = new_event();
  lanes.pushed = new_event();
  for (int i = 0; i < kMaxSlots; ++i) {
    lanes.pulled[i] = new_event();
    lanes.reduced[i] = new_event();
  }
}

void StreamPipeline::destroy(Lanes& lanes) {
  for (cudaStream_t s : {lanes.pull, lanes.push})
    if (s) cudaStreamDestroy(s);
  for (cudaEvent_t e : {lanes.fork, lanes.pulled_last, lanes.pushed})
    if (e) cudaEventDestroy(e);
  for (int i = 0; i < kMaxSlots; ++i) {
    if (lanes.pulled[i]) cudaEventDestroy(lanes.pulled[i]);
    if (lanes.reduced[i]) cudaEventDestroy(lanes.reduced[i]);
  }
}

StreamPipeline::StreamPipeline() {
  ScopeExit undo([this] {
    destroy(eager_);
    destroy(captured_);
  });
  make(eager_);
  make(captured_);
  undo.dismiss();
}

StreamPipeline::~StreamPipeline() {
  destroy(eager_);
  destroy(captured_);
}

void StreamPipeline::run(int pieces, int slots, cudaStream_t stream, const Stage& pull, const Stage& reduce,
                         const Stage& push) {
  SYMMPOOL_EXPECTS(slots >= 1 && slots <= kMaxSlots, "symmpool: a stream pipeline takes 1 to " +
                                                         std::to_string(kMaxSlots) + " slots, got " +
                                                         std::to_string(slots));
  if (pieces <= 0) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SYMMPOOL_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
  Lanes& lanes = capture == cudaStreamCaptureStatusNone ? eager_ : captured_;
  SYMMPOOL_CUDA_TRY(cudaEventRecord(lanes.fork, stream));
  SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(lanes.pull, lanes.fork, 0));
  SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(lanes.push, lanes.fork, 0));
  // From here on both side streams are forked: join them back whatever
  // happens (an unjoined fork would also spoil a capture), best effort
  // when a stage failed.
  ScopeExit join_after_failure([&] {
    for (cudaStream_t side : {lanes.pull, lanes.push})
      if (cudaEventRecord(lanes.pulled_last, side) == cudaSuccess)
        (void)cudaStreamWaitEvent(stream, lanes.pulled_last, 0);
  });
  for (int k = 0; k < pieces; ++k) {
    const int slot = k % slots;
    // The slot's last reader is the reduce of piece k - slots, whose record
    // of reduced[slot] is the latest one (piece k's comes below).
    if (k >= slots) SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(lanes.pull, lanes.reduced[slot], 0));
    pull(k, slot, lanes.pull);
    follow(stream, lanes.pulled[slot], lanes.pull);
    reduce(k, slot, stream);
    if (push) {
      follow(lanes.push, lanes.reduced[slot], stream);
      push(k, slot, lanes.push);
    } else {
      SYMMPOOL_CUDA_TRY(cudaEventRecord(lanes.reduced[slot], stream));
    }
  }
  // The pull stream is joined already (the last reduce waited for the last
  // pull); the push stream, even when it had nothing to do.
  follow(stream, lanes.pushed, lanes.push);
  join_after_failure.dismiss();
}

}  // namespace symmpool::detail
