// The fused tensor-parallel ops' kernels (torch.ops.symmpool.*; schemas and
// fake kernels in symmpool/fused_ops.py): argument checks, whether symmpool
// serves the call (the same decision on every rank, counted), the pipeline
// or the unfused fallback, and the result's layout. In C++ so that a call's
// host time is the pipeline's: as a Python body the same steps were a
// large part of a call's host time
// (bench/results/host_time_h100x1_2026-11-24_fused-ops-cpp-kernels-ab.json).

#include "tp/fused_ops.hpp"

#include "ops/functional_ops.hpp"
#include "torch_errors.hpp"
#include "tp/fused_one_shot.hpp"
#include "tp/fused_pipelines.hpp"
#include "tp/fused_steps.hpp"
#include "tp/fused_workspace.hpp"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace py = pybind11;

namespace symmpool::torch_ext {

namespace {

// -- counts -------------------------------------------------------------------------------------

constexpr std::array<const char*, 3> kOps = {"fused_all_gather_matmul", "fused_matmul_reduce_scatter",
                                             "pipelined_produce_and_all_to_all"};
enum Op { kAllGatherMatmul, kMatmulReduceScatter, kProduceAndAllToAll };

std::array<std::atomic<std::uint64_t>, 3> fused_calls{};
std::array<std::atomic<std::uint64_t>, 3> one_shot_calls{};  // of the fused ones, those run in one step

void count_one_shot(Op op, bool one_shot) {
  if (one_shot) one_shot_calls[op].fetch_add(1, std::memory_order_relaxed);
}
std::mutex fallbacks_mutex;
std::map<std::string, std::uint64_t> fallbacks;  // "<op>.fallback" and "<op>.fallback: <why>"

void count_fallback(Op op, const char* why) {
  std::lock_guard<std::mutex> lock(fallbacks_mutex);
  ++fallbacks[std::string(kOps[op]) + ".fallback"];
  ++fallbacks[std::string(kOps[op]) + ".fallback: " + why];
}

// -- messages as Python writes them -------------------------------------------------------------

std::string py_dtype(at::ScalarType t) { return "torch." + c10::getDtypeNames(t).first; }

std::string py_shape(at::IntArrayRef sizes) {
  std::ostringstream s;
  s << "(";
  for (std::size_t i = 0; i < sizes.size(); ++i) s << (i ? ", " : "") << sizes[i];
  s << (sizes.size() == 1 ? ",)" : ")");
  return s.str();
}

// -- arguments ----------------------------------------------------------------------------------

void check_group_size(std::int64_t group_size, Op op) {
  TORCH_CHECK_VALUE(group_size >= 1, kOps[op], ": group_size must be >= 1, got ", group_size);
}

// `dim` in [-dims, dims), made non-negative.
std::int64_t wrap_dim(std::int64_t dim, std::int64_t dims, const char* what, Op op) {
  TORCH_CHECK_VALUE(-dims <= dim && dim < dims, kOps[op], ": ", what, " ", dim, " is out of range for ", dims,
                    " dims");
  return dim < 0 ? dim + dims : dim;
}

c10::intrusive_ptr<c10d::ProcessGroup> group_of(c10::string_view group_name, std::int64_t group_size, Op op) {
  auto group = c10d::resolve_process_group(std::string(group_name));
  TORCH_CHECK_VALUE(group->getSize() == group_size, kOps[op], ": group_size is ", group_size, " but group '",
                    group_name, "' has ", group->getSize(), " ranks");
  return group;
}

void check_matmul(const at::Tensor& A, const at::Tensor& B, Op op) {
  TORCH_CHECK_VALUE(
      A.dim() >= 2 && B.dim() == 2 && A.size(-1) == B.size(0) && A.scalar_type() == B.scalar_type(), kOps[op],
      ": need A [..., k] and B [k, n] of one dtype, got ", py_dtype(A.scalar_type()), " ",
      py_shape(A.sizes()), " and ", py_dtype(B.scalar_type()), " ", py_shape(B.sizes()));
}

// -- fused or not -------------------------------------------------------------------------------

// Collective the first time (the group's heap forms): whether its ranks share a node.
bool peer_memory_available(PeerGroup& peers, c10::DeviceIndex device) {
  return call_translating_errors([&] { return peers.peer_memory(device) != nullptr; });
}

struct Fusing {
  std::shared_ptr<PeerGroup> peers;  // null: run unfused
  std::shared_ptr<FusedWorkspace> workspace;
};

// `t` as a matrix of its last dimension's rows; unlike reshape(-1, K), also
// where K is 0 (a rank left no columns by an uneven split).
at::Tensor as_rows(const at::Tensor& t) {
  const std::int64_t rows = c10::multiply_integers(t.sizes().begin(), t.sizes().end() - 1);
  return t.reshape({rows, t.size(-1)});
}

// Whether symmpool serves the call, with a workspace of `nbytes`: the same
// answer on every rank (it looks only at what every rank shares: the
// group, `tensors`' devices, the workspace's size and verdict), counted.
// `nbytes` is what moves between ranks (the gathered shard, the scattered
// product), the same on every rank; inner sizes may differ (an uneven split
// of K leaves one rank's A without columns), so they decide nothing.
Fusing fusing(Op op, c10d::ProcessGroup& group, c10::string_view group_name,
              std::initializer_list<const at::Tensor*> tensors, std::int64_t nbytes) {
  const char* why_not = nullptr;
  Fusing f;
  const at::Tensor& first = **tensors.begin();
  if (!std::all_of(tensors.begin(), tensors.end(), [](const at::Tensor* t) { return t->is_cuda(); })) {
    why_not = "CPU tensors";
  } else if (nbytes == 0) {
    why_not = "empty tensors";
  } else if (group.getSize() == 1) {
    why_not = "one rank";
  } else {
    const c10::DeviceIndex device = first.device().index();
    f.peers = peer_group_of(group, device);
    if (!f.peers) {
      why_not = "neither a symm nor an nccl group";
    } else if (!peer_memory_available(*f.peers, device)) {
      why_not = "ranks span nodes";
    } else {
      f.workspace = fused_workspace(*f.peers, std::string(group_name), device, nbytes);
      if (!f.workspace->holds(nbytes)) why_not = "workspace not symmetric";
    }
  }
  if (why_not) {
    count_fallback(op, why_not);
    return {};
  }
  fused_calls[op].fetch_add(1, std::memory_order_relaxed);
  return f;
}

// -- all-gather, then matmul --------------------------------------------------------------------

std::int64_t check_all_gather_matmul(const at::Tensor& A_shard, at::TensorList Bs, std::int64_t gather_dim,
                                     std::int64_t group_size) {
  const Op op = kAllGatherMatmul;
  check_group_size(group_size, op);
  TORCH_CHECK_VALUE(A_shard.dim() >= 2, kOps[op], ": A_shard must have at least 2 dims, got ", A_shard.dim());
  gather_dim = wrap_dim(gather_dim, A_shard.dim(), "gather_dim", op);
  const std::int64_t k = A_shard.size(-1) * (gather_dim == A_shard.dim() - 1 ? group_size : 1);
  TORCH_CHECK_VALUE(!Bs.empty(), kOps[op], ": Bs is empty");
  for (const at::Tensor& B : Bs)
    TORCH_CHECK_VALUE(B.dim() == 2 && B.size(0) == k && B.scalar_type() == A_shard.scalar_type() &&
                          B.device() == A_shard.device(),
                      kOps[op], ": every B must be a ", py_dtype(A_shard.scalar_type()), " matrix of ", k,
                      " rows on ", A_shard.device(), ", got ", py_dtype(B.scalar_type()), " ",
                      py_shape(B.sizes()), " on ", B.device());
  return gather_dim;
}

// The unfused fallbacks run the functional collectives' kernels (complex
// tensors as pairs of reals, waited as synchronous torch.distributed calls).
std::tuple<at::Tensor, std::vector<at::Tensor>> all_gather_matmul_unfused(const at::Tensor& A_shard,
                                                                          at::TensorList Bs,
                                                                          std::int64_t gather_dim,
                                                                          std::int64_t group_size,
                                                                          c10::string_view group_name) {
  const at::Tensor gathered = all_gather(A_shard.movedim(gather_dim, 0), group_size, group_name);
  at::Tensor A = gathered.movedim(0, gather_dim).contiguous();
  std::vector<at::Tensor> outs;
  for (const at::Tensor& B : Bs) outs.push_back(at::matmul(A, B));
  return {A, outs};
}

std::tuple<at::Tensor, std::vector<at::Tensor>> fused_all_gather_matmul(const at::Tensor& A_shard,
                                                                        at::TensorList Bs,
                                                                        std::int64_t gather_dim,
                                                                        std::int64_t group_size,
                                                                        c10::string_view group_name) {
  HostSteps steps("fused_all_gather_matmul");
  gather_dim = check_all_gather_matmul(A_shard, Bs, gather_dim, group_size);
  steps.mark("checks");
  auto group = group_of(group_name, group_size, kAllGatherMatmul);
  steps.mark("group");
  // From A_shard alone: each rank's Bs are its own (an uneven column split
  // may leave one rank's empty), and a decision that differed between ranks
  // would leave one in a collective the others never enter.
  Fusing f =
      fusing(kAllGatherMatmul, *group, group_name, {&A_shard}, A_shard.numel() * A_shard.element_size());
  steps.mark("decide");
  if (!f.peers) return all_gather_matmul_unfused(A_shard, Bs, gather_dim, group_size, group_name);
  const std::int64_t last = A_shard.dim() - 1;
  count_one_shot(kAllGatherMatmul, all_gather_in_one_shot(gather_dim != last, static_cast<int>(group_size),
                                                          A_shard.numel() * A_shard.element_size()));
  // Along K: A @ B sums each shard @ (its rank's rows of B), accumulated as they arrive.
  if (gather_dim == last) {
    const at::Tensor x = as_rows(A_shard);
    auto [shards, outs] = all_gather_matmul(*f.peers, x, Bs, 1, *f.workspace);
    std::vector<std::int64_t> lead = A_shard.sizes().slice(0, last).vec();
    lead.push_back(-1);
    at::Tensor A = shards.permute({1, 0, 2}).reshape({x.size(0), group_size * x.size(1)}).view(lead);
    for (at::Tensor& out : outs) out = out.view(lead);
    return {A, outs};
  }
  const at::Tensor x = A_shard.movedim(gather_dim, 0);
  auto [A_flat, outs] = all_gather_matmul(*f.peers, as_rows(x), Bs, 0, *f.workspace);
  steps.mark("pipeline");
  if (A_shard.dim() == 2) return {A_flat, outs};  // [M, K] along rows, the common case: nothing to lay out
  std::vector<std::int64_t> lead = x.sizes().slice(0, last).vec();
  lead[0] *= group_size;
  auto shape_out = [&](const at::Tensor& flat) {
    std::vector<std::int64_t> shape = lead;
    shape.push_back(flat.size(-1));
    return flat.view(shape).movedim(0, gather_dim).contiguous();
  };
  for (at::Tensor& out : outs) out = shape_out(out);
  return {shape_out(A_flat), outs};
}

// -- matmul, then reduce-scatter or all-to-all --------------------------------------------------

std::int64_t check_reduce_scatter(const at::Tensor& A, const at::Tensor& B, c10::string_view reduce_op,
                                  std::int64_t scatter_dim, std::int64_t group_size) {
  const Op op = kMatmulReduceScatter;
  check_group_size(group_size, op);
  check_matmul(A, B, op);
  TORCH_CHECK_VALUE(reduce_op == "sum" || reduce_op == "avg", kOps[op],
                    ": reduce_op must be 'sum' or 'avg', got '", reduce_op, "'");
  scatter_dim = wrap_dim(scatter_dim, A.dim(), "scatter_dim", op);
  const std::int64_t extent = scatter_dim == A.dim() - 1 ? B.size(1) : A.size(scatter_dim);
  TORCH_CHECK_VALUE(extent % group_size == 0, kOps[op], ": dim ", scatter_dim, " of A @ B (", extent,
                    ") is not divisible by the group size ", group_size);
  return scatter_dim;
}

at::Tensor matmul_reduce_scatter_unfused(const at::Tensor& A, const at::Tensor& B, c10::string_view reduce_op,
                                         std::int64_t scatter_dim, std::int64_t group_size,
                                         c10::string_view group_name) {
  const at::Tensor product = at::matmul(A, B).movedim(scatter_dim, 0);
  return reduce_scatter(product, reduce_op, group_size, group_name).movedim(0, scatter_dim).contiguous();
}

at::Tensor fused_matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B, c10::string_view reduce_op,
                                       std::int64_t scatter_dim, std::int64_t group_size,
                                       c10::string_view group_name) {
  scatter_dim = check_reduce_scatter(A, B, reduce_op, scatter_dim, group_size);
  auto group = group_of(group_name, group_size, kMatmulReduceScatter);
  std::vector<std::int64_t> shape = A.sizes().vec();
  shape.back() = B.size(1);
  shape[scatter_dim] /= group_size;
  const std::int64_t elements = c10::multiply_integers(shape);
  Fusing f =
      fusing(kMatmulReduceScatter, *group, group_name, {&A, &B}, group_size * elements * A.element_size());
  if (!f.peers) return matmul_reduce_scatter_unfused(A, B, reduce_op, scatter_dim, group_size, group_name);
  const std::string how(reduce_op);
  count_one_shot(kMatmulReduceScatter,
                 reduce_scatter_in_one_shot(scatter_dim == A.dim() - 1 ? 1 : 0,
                                            group_size * elements * A.element_size(), A.scalar_type(), how));
  if (scatter_dim == A.dim() - 1)  // each rank owns a block of B's columns
    return produce_and_all_to_all(*f.peers, as_rows(A), B, 1, *f.workspace, how).view(shape);
  const at::Tensor x = A.movedim(scatter_dim, 0);
  at::Tensor flat = produce_and_all_to_all(*f.peers, as_rows(x), B, 0, *f.workspace, how);
  if (A.dim() == 2) return flat;  // [M, N] along rows, the common case: nothing to lay out
  std::vector<std::int64_t> moved = {shape[scatter_dim]};
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (static_cast<std::int64_t>(i) != scatter_dim) moved.push_back(shape[i]);
  return flat.view(moved).movedim(0, scatter_dim).contiguous();
}

at::Tensor pipelined_produce_and_all_to_all(const at::Tensor& A, const at::Tensor& B, std::int64_t group_size,
                                            c10::string_view group_name) {
  const Op op = kProduceAndAllToAll;
  check_group_size(group_size, op);
  check_matmul(A, B, op);
  TORCH_CHECK_VALUE(A.dim() == 2 && A.size(0) % group_size == 0, kOps[op],
                    ": A must be a matrix whose rows (", A.dim() ? A.size(0) : 0,
                    ") divide by the group size ", group_size, ", got ", py_shape(A.sizes()));
  auto group = group_of(group_name, group_size, op);
  const std::int64_t n = B.size(1);
  Fusing f = fusing(op, *group, group_name, {&A, &B}, A.size(0) * n * A.element_size());
  if (!f.peers) {
    at::Tensor out = A.new_empty({A.size(0), n});
    at::Tensor out_real = as_real(out), product = as_real(at::matmul(A, B).contiguous());
    std::vector<std::int64_t> even;  // equal chunks
    c10d::AllToAllOptions opts;
    opts.asyncOp = false;  // on the caller's stream, as a synchronous dist call
    wait_if_any(group->alltoall_base(out_real, product, even, even, opts));
    return out;
  }
  return produce_and_all_to_all(*f.peers, A, B, 0, *f.workspace, "none").view({A.size(0), n});
}

}  // namespace

void define_fused_ops(py::module& m) {
  m.def(
      "_impl_fused_ops",
      [] {
        // One library for the process's life, as torch.library's are.
        static auto* impl =
            new torch::Library(torch::Library::IMPL, "symmpool", c10::DispatchKey::CompositeExplicitAutograd,
                               __FILE__, __LINE__);
        impl->impl("fused_all_gather_matmul", TORCH_FN(fused_all_gather_matmul));
        impl->impl("fused_matmul_reduce_scatter", TORCH_FN(fused_matmul_reduce_scatter));
        impl->impl("pipelined_produce_and_all_to_all", TORCH_FN(pipelined_produce_and_all_to_all));
      },
      "Registers the fused ops' C++ kernels, once symmpool/fused_ops.py has defined their schemas.");
  m.def(
      "_fused_op_counts",
      [] {
        std::map<std::string, std::uint64_t> counts;
        for (std::size_t op = 0; op < kOps.size(); ++op)
          if (std::uint64_t n = fused_calls[op].load(std::memory_order_relaxed)) {
            counts[std::string(kOps[op]) + ".fused"] = n;
            counts[std::string(kOps[op]) + ".fused in one step"] =
                one_shot_calls[op].load(std::memory_order_relaxed);
          }
        std::lock_guard<std::mutex> lock(fallbacks_mutex);
        for (const auto& [key, n] : fallbacks) counts[key] = n;
        return counts;
      },
      "Fused-op calls of this process by where they ran: '<op>.fused' (of which '<op>.fused in one "
      "step'), '<op>.fallback' and '<op>.fallback: <why>'.");
  m.def("_reset_fused_op_counts", [] {
    for (auto& n : fused_calls) n.store(0, std::memory_order_relaxed);
    for (auto& n : one_shot_calls) n.store(0, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(fallbacks_mutex);
    fallbacks.clear();
  });
  m.def(
      "_reserve_workspace",
      [](const std::string& group_name, c10::DeviceIndex device, std::int64_t nbytes) -> bool {
        HANDLE_TH_ERRORS  // a TORCH_WARN (no memory to grow) reaches Python's warnings
            py::gil_scoped_release no_gil;
        auto peers = require_peer_group(group_name, device, "reserve_workspace");
        if (!peer_memory_available(*peers, device)) return false;
        return fused_workspace(*peers, group_name, device, nbytes)->holds(nbytes);
        END_HANDLE_TH_ERRORS_PYBIND
      },
      py::arg("group_name"), py::arg("device"), py::arg("nbytes"),
      "Collective: grows the group's fused-op workspace to nbytes now; whether the fused ops will run on "
      "it.");
  m.def("_fused_workspace", &existing_fused_workspace, py::arg("group_name"), py::arg("device"),
        "The group's workspace on device, or None before its first fused call (tests, benches).");
}

}  // namespace symmpool::torch_ext
