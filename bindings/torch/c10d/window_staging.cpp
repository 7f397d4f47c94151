#include "c10d/window_staging.hpp"

#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <atomic>

namespace symmpool::torch_ext {

namespace {

std::atomic<std::uint64_t> staged_calls{0};

bool in_windows(const NcclWindows* windows, const at::Tensor& t) {
  return windows != nullptr && t.numel() > 0 && windows->covers(t.data_ptr(), t.nbytes());
}

bool same_tensor(const at::Tensor& a, const at::Tensor& b) {
  return a.data_ptr() == b.data_ptr() && a.nbytes() == b.nbytes();
}

}  // namespace

std::uint64_t staged_nccl_calls() { return staged_calls.load(std::memory_order_relaxed); }

at::Tensor StagedOutsideWindows::plain_like(const at::Tensor& t) const {
  at::Tensor plain = at::empty_like(t, at::MemoryFormat::Contiguous);
  TORCH_CHECK(!in_windows(windows_, plain),
              "symm: staging a collective's buffers outside NCCL's symmetric windows took memory inside one "
              "(symmpool's MemPool allocates for this thread); run the collective outside "
              "torch.cuda.use_mem_pool, or set SYMMPOOL_NCCL_WINDOWS=0");
  return plain;
}

StagedOutsideWindows::StagedOutsideWindows(const NcclWindows* windows, const std::vector<at::Tensor>& inputs,
                                           const std::vector<at::Tensor>& outputs)
    : windows_(windows), inputs_(inputs), outputs_(outputs), callers_outputs_(outputs) {
  if (windows_ == nullptr) return;
  for (std::size_t i = 0; i < inputs_.size(); ++i) {
    if (!in_windows(windows_, inputs_[i])) continue;
    at::Tensor staged = plain_like(inputs_[i]);
    staged.copy_(inputs_[i]);
    // In place: the output is the same tensor, staged once.
    for (std::size_t o = 0; o < outputs_.size(); ++o)
      if (same_tensor(callers_outputs_[o], inputs_[i])) {
        outputs_[o] = staged;
        copied_back_.emplace_back(callers_outputs_[o], staged);
      }
    inputs_[i] = std::move(staged);
    staged_inputs_ = true;
  }
  for (std::size_t o = 0; o < outputs_.size(); ++o) {
    if (!same_tensor(outputs_[o], callers_outputs_[o]) || !in_windows(windows_, outputs_[o])) continue;
    outputs_[o] = plain_like(outputs_[o]);
    copied_back_.emplace_back(callers_outputs_[o], outputs_[o]);
  }
}

c10::intrusive_ptr<c10d::Work> StagedOutsideWindows::finish(
    c10::intrusive_ptr<c10d::Work> work, c10d::OpType type,
    std::shared_ptr<const detail::FailureRecord> failure, bool blocking_wait) {
  if (!staged()) return work;
  staged_calls.fetch_add(1, std::memory_order_relaxed);
  // Staged inputs live on in ProcessGroupNCCL's stash until its work ends.
  if (copied_back_.empty()) return work;
  const std::uint64_t sequence = work ? work->getSequencenumber() : 0;
  if (work) work->wait();  // the current stream waits for NCCL's (the host too under blocking wait)
  for (auto& [callers, staged] : copied_back_) callers.copy_(staged);
  const at::Device device = callers_outputs_.empty() ? inputs_.at(0).device() : callers_outputs_[0].device();
  return c10::make_intrusive<SymmWork>(callers_outputs_, type, sequence,
                                       c10::cuda::getCurrentCUDAStream(device.index()), detail::SharedEvent{},
                                       std::move(failure), blocking_wait);
}

}  // namespace symmpool::torch_ext
