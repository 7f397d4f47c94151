#pragma once
// symmpool._C's functional collectives (torch.ops.symmpool.all_gather,
// reduce_scatter, all_reduce): their C++ kernels, registered once
// symmpool/ops.py has defined the schemas.

#include <ATen/ATen.h>
#include <c10/util/string_view.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>

namespace symmpool::torch_ext {

void define_functional_ops(pybind11::module& m);

// The kernels, also the fused ops' unfused fallbacks: every rank's `input`
// concatenated along dim 0; this rank's dim-0 part of their sum or mean
// ("sum", "avg"); that reduction whole. Each waits as a synchronous
// torch.distributed call does.
at::Tensor all_gather(const at::Tensor& input, std::int64_t group_size, c10::string_view group_name);
at::Tensor reduce_scatter(const at::Tensor& input, c10::string_view op, std::int64_t group_size,
                          c10::string_view group_name);
at::Tensor all_reduce(const at::Tensor& input, c10::string_view op, c10::string_view group_name);
// `t` as torch.distributed sends it: a complex tensor as pairs of reals.
at::Tensor as_real(const at::Tensor& t);

// Waits for a synchronous (asyncOp = false) c10d call. ProcessGroupNCCL
// returns no Work for those (torch >= 2.8: the collective is already on the
// caller's stream); gloo and symmpool return one to wait on.
inline void wait_if_any(const c10::intrusive_ptr<c10d::Work>& work) {
  if (work) work->wait();
}

}  // namespace symmpool::torch_ext
