#include "c10d/symm_work.hpp"

#include <symmpool/detail/deadline.hpp>

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/cuda/CUDAEventCache.hpp>

#include <stdexcept>
#include <thread>

namespace symmpool::torch_ext {

SymmWork::SymmWork(std::vector<at::Tensor> outputs, c10d::OpType type, std::uint64_t sequence,
                   c10::cuda::CUDAStream stream, detail::SharedEvent done,
                   std::shared_ptr<const detail::FailureRecord> failure, bool blocking_wait)
    : Work(-1, type),
      outputs_(std::move(outputs)),
      sequence_(sequence),
      stream_(stream),
      done_(std::move(done)),
      failure_(std::move(failure)),
      blocking_wait_(blocking_wait) {
  if (done_) return;
  // Reused events: making and destroying one per collective was a visible
  // share of an eager all-reduce's host time.
  own_done_ = c10d::CUDAEventCache::get(stream.device_index())->create(/*timing=*/false);
  own_done_->record(stream);
}

bool SymmWork::done_query() const {
  if (!done_) return own_done_->query();
  const cudaError_t status = cudaEventQuery(done_.get());
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error to keep
    return false;
  }
  C10_CUDA_CHECK(status);
  return true;
}

// Made on first use: most callers (FSDP2) only wait(), and making it costs
// host time on every collective.
c10::intrusive_ptr<c10::ivalue::Future> SymmWork::getFuture() {
  std::call_once(future_made_, [this] {
    // As ProcessGroupNCCL: the future is complete once enqueued; marking it
    // records an event on the current stream of its device, made here the
    // collective's stream (so the event follows the collective), and whoever
    // waits on the future waits on that.
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::vector<c10::Device>{stream_.device()});
    c10::cuda::CUDAStreamGuard on_collective_stream(stream_);
    future_->markCompleted(c10::IValue(outputs_));
  });
  return future_;
}

// DistBackendError, as ProcessGroupNCCL raises. (The SIGSEGV once seen on
// wait()'s timeout came from writing its numbers with a private copy of
// libstdc++, not from the exception type: cmake/SharedLibstdcxx.cmake.)
void SymmWork::raise_if_failed() const {
  if (failure_ && failure_->failed()) C10_THROW_ERROR(DistBackendError, failure_->message());
}

bool SymmWork::isCompleted() { return (failure_ && failure_->failed()) || done_query(); }

bool SymmWork::isSuccess() const { return !(failure_ && failure_->failed()); }

std::exception_ptr SymmWork::exception() const {
  if (!failure_ || !failure_->failed()) return nullptr;
  return std::make_exception_ptr(std::runtime_error(failure_->message()));
}

void SymmWork::blockCurrentStream() {
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(stream_.device_index());
  // The collective was enqueued on this stream: what comes next on it runs
  // after it already (FSDP2 and dist's synchronous calls wait here).
  if (current == stream_) return;
  c10::cuda::CUDAGuard guard(stream_.device());
  if (!done_) return own_done_->block(current);
  C10_CUDA_CHECK(cudaStreamWaitEvent(current.stream(), done_.get(), 0));
}

bool SymmWork::wait(std::chrono::milliseconds timeout) {
  raise_if_failed();
  if (blocking_wait_ || timeout != ::kNoTimeout) {
    // The host waits for the collective's end or its failure, as NCCL's
    // does with TORCH_NCCL_BLOCKING_WAIT or a timeout given to wait(); the
    // communicator's own timeout bounds it too. Saturated: a huge timeout
    // (timedelta.max) must not wrap into the past.
    const auto deadline = detail::deadline_after(timeout);
    while (!done_query() && !(failure_ && failure_->failed())) {
      if (timeout != ::kNoTimeout && std::chrono::steady_clock::now() > deadline) {
        std::int64_t bytes = 0;
        for (const at::Tensor& t : outputs_) bytes += static_cast<std::int64_t>(t.nbytes());
        C10_THROW_ERROR(DistBackendError,
                        c10::str("symm: ", c10d::opTypeToString(opType_), " #", sequence_, " (", bytes,
                                 " bytes of output) did not finish within ", timeout.count(), " ms"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    raise_if_failed();
  }
  blockCurrentStream();
  return true;
}

void SymmWork::synchronize() { blockCurrentStream(); }

}  // namespace symmpool::torch_ext
