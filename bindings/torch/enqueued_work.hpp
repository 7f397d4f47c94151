#pragma once
// The Work of a collective symmpool enqueued on the caller's current stream:
// already ordered where NCCL's wait() would order it, so waiting is a no-op.

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace symmpool::torch_ext {

class EnqueuedWork final : public c10d::Work {
 public:
  EnqueuedWork(std::vector<at::Tensor> outputs, c10d::OpType type)
      : Work(-1, type), outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
    future_->markCompleted(c10::IValue(outputs_));
    finish();
  }
  bool isCompleted() override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace symmpool::torch_ext
