#pragma once
// Plain copies of a call's tensors that lie in NCCL's symmetric windows, for
// an NCCL call the router did not check (collective_routing.hpp): NCCL runs
// its symmetric kernels on any call whose buffers lie in windows, reading
// each peer at this rank's offset, so unchecked window memory could meet a
// peer's buffer at another offset, or a peer running NCCL's other kernels.
// Staged, no rank hands NCCL window memory for the call.

#include "c10d/symm_work.hpp"

#include <symmpool/detail/failure_record.hpp>
#include <symmpool/nccl_windows.hpp>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <vector>

namespace symmpool::torch_ext {

class StagedOutsideWindows {
 public:
  // Replaces, in copies of `inputs` and `outputs`, each tensor that lies in
  // one of `windows`'s windows (null: none) by a plain one from torch's
  // allocator, the inputs' bytes copied on the current stream; an output
  // that is also an input (in place) stays one tensor. Raises where a plain
  // tensor cannot be had outside the windows (symmpool's MemPool is this
  // thread's allocator).
  StagedOutsideWindows(const NcclWindows* windows, const std::vector<at::Tensor>& inputs,
                       const std::vector<at::Tensor>& outputs);

  bool staged() const { return !copied_back_.empty() || staged_inputs_; }
  std::vector<at::Tensor>& inputs() { return inputs_; }
  std::vector<at::Tensor>& outputs() { return outputs_; }

  // After NCCL's `work` was enqueued on the staged tensors: the current
  // stream waits for it, the staged outputs are copied back into the
  // caller's, and a Work that ends after those copies comes back.
  c10::intrusive_ptr<c10d::Work> finish(c10::intrusive_ptr<c10d::Work> work, c10d::OpType type,
                                        std::shared_ptr<const detail::FailureRecord> failure,
                                        bool blocking_wait);

 private:
  at::Tensor plain_like(const at::Tensor& t) const;

  const NcclWindows* windows_;
  std::vector<at::Tensor> inputs_, outputs_;
  std::vector<at::Tensor> callers_outputs_;
  std::vector<std::pair<at::Tensor, at::Tensor>> copied_back_;  // (caller's, staged)
  bool staged_inputs_ = false;
};

// Calls that NCCL ran on staged copies, process-wide.
std::uint64_t staged_nccl_calls();

}  // namespace symmpool::torch_ext
