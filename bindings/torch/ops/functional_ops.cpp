// The functional collectives' kernels (torch.ops.symmpool.all_gather,
// reduce_scatter, all_reduce, all_reduce_; schemas and fake kernels in
// symmpool/ops.py):
// check the group size, resolve the group by name, run the group's
// collective into a new tensor and wait for it, as a synchronous
// torch.distributed call does. On a plain NCCL group symmpool's router
// decides first (group_symmetry.hpp), as a "symm" backend's does. In C++ so that a call costs the backend's
// host time without torch.distributed's Python wrapper around it
// (bench/results/host_time_h100x1_2026-11-24_functional-ops-cpp-ab.json).

#include "ops/functional_ops.hpp"

#include "c10d/group_symmetry.hpp"
#include "c10d/symm_backend.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>

#include <cstdint>
#include <string>
#include <vector>

namespace py = pybind11;

namespace symmpool::torch_ext {

namespace {

c10::intrusive_ptr<c10d::ProcessGroup> group_of(const char* op, std::int64_t group_size,
                                                c10::string_view group_name) {
  TORCH_CHECK_VALUE(group_size >= 1, "symmpool::", op, ": group_size must be >= 1, got ", group_size);
  auto group = c10d::resolve_process_group(std::string(group_name));
  TORCH_CHECK_VALUE(group->getSize() == group_size, "symmpool::", op, ": group_size=", group_size,
                    " but group '", group_name, "' has ", group->getSize(), " ranks");
  return group;
}

c10d::ReduceOp reduce_op(c10::string_view op) {
  if (op == "sum") return c10d::ReduceOp::SUM;
  TORCH_CHECK_VALUE(op == "avg", "symmpool ops reduce with 'sum' or 'avg', got '", op, "'");
  return c10d::ReduceOp::AVG;
}

std::vector<std::int64_t> rows_times(const at::Tensor& t, const char* op, std::int64_t factor) {
  TORCH_CHECK_VALUE(t.dim() >= 1, "symmpool::", op, ": the input needs at least one dim, got a scalar");
  std::vector<std::int64_t> shape = t.sizes().vec();
  shape[0] *= factor;
  return shape;
}

// symmpool's side of a plain NCCL group, where `t` is a CUDA tensor and the
// group's CUDA backend is NCCL but not "symm" (which routes its own calls);
// otherwise null.
std::shared_ptr<GroupSymmetry> plain_nccl_group(c10d::ProcessGroup& group, const at::Tensor& t) {
  if (!t.is_cuda()) return nullptr;
  return std::dynamic_pointer_cast<GroupSymmetry>(peer_group_of(group, t.device().index()));
}

// Waits (in stream order) where symmpool ran the call; false where the
// group's own backend must.
bool ran_on_symmpool(const c10::intrusive_ptr<c10d::Work>& work) {
  if (!work) return false;
  work->wait();
  return true;
}

}  // namespace

// Complex tensors travel as pairs of reals, as torch.distributed sends them
// for all-gather, all-reduce and all-to-all (sum and mean act on each part
// alone, so reduce-scatter takes them too).
at::Tensor as_real(const at::Tensor& t) { return t.is_complex() ? at::view_as_real(t) : t; }

at::Tensor all_gather(const at::Tensor& input, std::int64_t group_size, c10::string_view group_name) {
  auto group = group_of("all_gather", group_size, group_name);
  at::Tensor out = input.new_empty(rows_times(input, "all_gather", group_size));
  at::Tensor out_real = as_real(out), in_real = as_real(input.contiguous());
  if (auto plain = plain_nccl_group(*group, input))
    if (ran_on_symmpool(plain->all_gather(out_real, in_real))) return out;
  c10d::AllgatherOptions opts;
  opts.asyncOp = false;  // on the caller's stream, as a synchronous dist call
  wait_if_any(group->_allgather_base(out_real, in_real, opts));
  return out;
}

at::Tensor reduce_scatter(const at::Tensor& input, c10::string_view op, std::int64_t group_size,
                          c10::string_view group_name) {
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = reduce_op(op);
  opts.asyncOp = false;
  auto group = group_of("reduce_scatter", group_size, group_name);
  std::vector<std::int64_t> shape = rows_times(input, "reduce_scatter", 1);
  TORCH_CHECK_VALUE(shape[0] % group_size == 0, "symmpool::reduce_scatter: dim 0 (", shape[0],
                    ") is not divisible by group_size ", group_size);
  shape[0] /= group_size;
  at::Tensor out = input.new_empty(shape);
  at::Tensor out_real = as_real(out), in_real = as_real(input.contiguous());
  if (auto plain = plain_nccl_group(*group, input))
    if (ran_on_symmpool(plain->reduce_scatter(out_real, in_real, opts.reduceOp))) return out;
  wait_if_any(group->_reduce_scatter_base(out_real, in_real, opts));
  return out;
}

// On a "symm" group the backend runs it straight into a new tensor (no
// copy of the input first, no trip through c10d's dispatcher, no Work;
// docs/usage.md has the before and after).
at::Tensor all_reduce(const at::Tensor& input, c10::string_view op, c10::string_view group_name) {
  c10d::AllreduceOptions opts;
  opts.reduceOp = reduce_op(op);
  opts.asyncOp = false;
  auto group = c10d::resolve_process_group(std::string(group_name));
  if (input.is_cuda()) {
    if (auto backend = symm_backend_of(*group)) {
      at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
      at::Tensor out_real = as_real(out), in_real = as_real(input.contiguous());
      if (static_cast<SymmBackend&>(*backend).all_reduce_now(out_real, in_real, opts)) return out;
    }
  }
  at::Tensor out = input.clone(at::MemoryFormat::Contiguous);
  at::Tensor out_real = as_real(out);
  if (auto plain = plain_nccl_group(*group, input))
    if (ran_on_symmpool(plain->all_reduce(out_real, opts.reduceOp))) return out;
  std::vector<at::Tensor> tensors{out_real};
  wait_if_any(group->allreduce(tensors, opts));
  return out;
}

// In place, as torch's two_shot_all_reduce_ and c10d's all_reduce_: no
// output to allocate
// (bench/results/host_time_h200x2_2026-11-27_small-all-reduce-op-vs-torch.json).
// A tensor that is not contiguous is reduced through a contiguous copy and
// written back.
void all_reduce_(at::Tensor& input, c10::string_view op, c10::string_view group_name) {
  if (!input.is_contiguous()) {
    input.copy_(all_reduce(input, op, group_name));
    return;
  }
  c10d::AllreduceOptions opts;
  opts.reduceOp = reduce_op(op);
  opts.asyncOp = false;
  auto group = c10d::resolve_process_group(std::string(group_name));
  at::Tensor real = as_real(input);
  if (input.is_cuda()) {
    if (auto backend = symm_backend_of(*group)) {
      if (static_cast<SymmBackend&>(*backend).all_reduce_now(real, real, opts)) return;
    }
  }
  if (auto plain = plain_nccl_group(*group, input))
    if (ran_on_symmpool(plain->all_reduce(real, opts.reduceOp))) return;
  std::vector<at::Tensor> tensors{real};
  wait_if_any(group->allreduce(tensors, opts));
}

void define_functional_ops(py::module& m) {
  m.def(
      "_impl_functional_ops",
      [] {
        // One library for the process's life, as torch.library's are.
        static auto* impl =
            new torch::Library(torch::Library::IMPL, "symmpool", c10::DispatchKey::CompositeExplicitAutograd,
                               __FILE__, __LINE__);
        impl->impl("all_gather", TORCH_FN(all_gather));
        impl->impl("reduce_scatter", TORCH_FN(reduce_scatter));
        impl->impl("all_reduce", TORCH_FN(all_reduce));
        impl->impl("all_reduce_", TORCH_FN(all_reduce_));
      },
      "Registers the functional collectives' C++ kernels, once symmpool/ops.py has defined their schemas.");
}

}  // namespace symmpool::torch_ext
