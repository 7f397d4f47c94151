#pragma once
// The Work of a collective symmpool enqueued on the caller's current stream,
// with ProcessGroupNCCL's semantics: an event marks its end; wait() blocks
// the current stream on it (and the host too under TORCH_NCCL_BLOCKING_WAIT,
// up to the timeout); a failure of the group's communicator is reported by
// wait(), isCompleted(), isSuccess() and exception(), also after the
// communicator is gone; the Future (made on first use) carries the device,
// so callbacks (DDP comm hooks) run after the collective on their own streams.

#include <symmpool/detail/failure_record.hpp>
#include <symmpool/detail/shared_event.hpp>

#include <ATen/core/ivalue.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <mutex>

namespace symmpool::torch_ext {

class SymmWork final : public c10d::Work {
 public:
  // Right after the collective was enqueued on `stream`; `done` is its end
  // as the communicator recorded it (null: the Work records its own).
  SymmWork(std::vector<at::Tensor> outputs, c10d::OpType type, std::uint64_t sequence,
           c10::cuda::CUDAStream stream, detail::SharedEvent done,
           std::shared_ptr<const detail::FailureRecord> failure, bool blocking_wait);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;
  void blockCurrentStream() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override { return sequence_; }

 private:
  void raise_if_failed() const;
  bool done_query() const;  // whether the GPU passed the collective's end

  std::vector<at::Tensor> outputs_;
  std::uint64_t sequence_;
  c10::cuda::CUDAStream stream_;                   // the collective's
  detail::SharedEvent done_;                       // the communicator's, or:
  std::shared_ptr<at::cuda::CUDAEvent> own_done_;  // from torch's event cache, as ProcessGroupNCCL's
  std::shared_ptr<const detail::FailureRecord> failure_;
  bool blocking_wait_;
  std::once_flag future_made_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace symmpool::torch_ext
