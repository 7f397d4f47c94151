// The fused tensor-parallel ops' pipelines, one C++ call each: fused_ops.cpp
// decides whether to fuse and sizes the workspace; these order the call
// after the workspace's last use and enqueue its copies, matmuls and
// barriers, shard by shard, or in one step where the call is small
// (fused_one_shot.cpp). Written as Python loops they took several times
// the GPU's time on the host
// (bench/results/tp_ops_h200x2_2026-11-23_host-time-8b.json).

#include "tp/fused_pipelines.hpp"

#include "torch_errors.hpp"
#include "tp/fused_one_shot.hpp"
#include "tp/fused_steps.hpp"
#include "tp/peer_memory.hpp"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace py = pybind11;

namespace symmpool::torch_ext {

using c10::cuda::CUDAStream;

// all-gather of x [m, k] through the workspace, each rank's shard consumed
// by the matmuls as soon as it has arrived. Along rows (dim 0): returns
// (A [world * m, k], [A @ B for B in Bs]), shard r's rows of each product
// computed from shard r. Along columns (dim 1, K): returns (the shards
// stacked [world, m, k]; Python lays them side by side, [A @ B]), where
// A @ B sums shard r @ (B's rows r) over the ranks, accumulated as shards arrive.
std::tuple<at::Tensor, std::vector<at::Tensor>> all_gather_matmul(PeerGroup& peers, const at::Tensor& x_in,
                                                                  at::TensorList Bs, std::int64_t gather_dim,
                                                                  FusedWorkspace& workspace) {
  HostSteps steps("all_gather_matmul");
  check_matrix(x_in, "A_shard (as a matrix)");
  TORCH_CHECK(gather_dim == 0 || gather_dim == 1, "symmpool fused ops: gather_dim must be 0 or 1, got ",
              gather_dim);
  const c10::DeviceIndex device = x_in.device().index();
  c10::cuda::CUDAGuard guard(device);
  Communicator& comm = peer_memory_communicator(peers, device);
  const int world = comm.world(), rank = comm.rank();
  WorkspaceUse use(workspace, device);
  const CUDAStream &main = use.main(), &copies = use.copies();
  const at::Tensor x = x_in.contiguous();
  const std::int64_t m = x.size(0), k = x.size(1);
  const bool rows = gather_dim == 0;
  const std::size_t shard_bytes = bytes_of(x);
  if (all_gather_in_one_shot(rows, world, static_cast<std::int64_t>(shard_bytes)))
    return all_gather_then_matmul(comm, use, x, Bs, steps);
  const at::Tensor mine = staging(use.buffer(), {m, k}, x.scalar_type());
  // Shard r's place in the gathered A: rows r of A_flat, or slot r of the stack.
  at::Tensor gathered = rows ? at::empty({world * m, k}, x.options()) : at::empty({world, m, k}, x.options());
  auto shard = [&](int r) { return rows ? gathered.narrow(0, r * m, m) : gathered[r]; };
  std::vector<at::Tensor> outs;
  outs.reserve(Bs.size());
  for (const at::Tensor& B : Bs) outs.push_back(at::empty({rows ? world * m : m, B.size(1)}, x.options()));
  // The matmuls of shard r: its rows of each product, or its term of the sum.
  auto consume = [&](int r, const at::Tensor& a, bool first) {
    for (std::size_t i = 0; i < Bs.size(); ++i) {
      if (rows)
        mm_into(outs[i].narrow(0, r * m, m), a, Bs[i]);
      else if (first)
        mm_into(outs[i], a, Bs[i].narrow(0, r * k, k));
      else
        at::addmm_out(outs[i], outs[i], a, Bs[i].narrow(0, r * k, k));
    }
    steps.mark("matmuls");
  };
  steps.mark("setup");

  // Our shard into the workspace, where the peers read it, on the caller's
  // stream ahead of our own matmuls: a copy within one GPU runs on SMs, so
  // beside a matmul that holds every SM it starts only as the matmul drains
  // (on the copy stream it began late in the matmul and every pull waited
  // behind it: bench/tp_ops/README.md). The meeting, after which every
  // workspace is ready, and the pulls (copy engines) go on the copy stream.
  copy_bytes(mine.data_ptr(), x.data_ptr(), shard_bytes, main);
  steps.mark("stage");
  use.fork();
  steps.mark("fork");
  meet(comm, copies);
  steps.mark("meet");
  // Our shard's place in the gathered A: on the copy stream once the pulls
  // are enqueued, so it waits for SMs beside the last matmuls, not ahead of a pull.
  auto place_own_shard = [&] { copy_bytes(shard(rank).data_ptr(), x.data_ptr(), shard_bytes, copies); };
  if (world == 1) place_own_shard();
  consume(rank, x, /*first=*/true);
  for (int step = 1; step < world; ++step) {
    const int src = (rank + step) % world;
    void* remote =
        call_translating_errors([&] { return comm.peer_address(mine.data_ptr(), shard_bytes, src); });
    steps.mark("address");
    copy_bytes(shard(src).data_ptr(), remote, shard_bytes, copies);
    steps.mark("pull");
    wait_stream(main, copies, use.joined());
    steps.mark("join");
    if (step == world - 1) place_own_shard();
    steps.mark("place");
    consume(src, shard(src), /*first=*/false);
  }
  wait_stream(main, copies, use.joined());
  steps.mark("join");
  // Nobody reads our workspace any more.
  meet(comm, main);
  steps.mark("meet");
  use.finish();
  steps.mark("finish");
  return {gathered, outs};
}

// Every rank's chunk for rank d is produced by a matmul: rows d of A times B
// (split 0) or A times B's column block d (split 1). Each chunk for a peer
// is made in a staging buffer and pushed into the peer's workspace slot by
// the copy engines while the next one is made; ours goes last, straight into
// our slot. The slots [world, chunk rows, chunk columns] (slot s from rank
// s) are then combined as `how` says: summed or averaged over the slots
// ("sum", "avg": [chunk rows, chunk columns]) or copied ("none": all of them).
at::Tensor produce_and_all_to_all(PeerGroup& peers, const at::Tensor& A, const at::Tensor& B,
                                  std::int64_t split, FusedWorkspace& workspace, const std::string& how) {
  check_matrix(A, "A");
  check_matrix(B, "B");
  TORCH_CHECK(split == 0 || split == 1,
              "symmpool fused ops: split must be 0 (rows of A) or 1 (columns of B)");
  TORCH_CHECK(how == "sum" || how == "avg" || how == "none",
              "symmpool fused ops: combine the slots by 'sum', 'avg' or 'none', got '", how, "'");
  const c10::DeviceIndex device = A.device().index();
  c10::cuda::CUDAGuard guard(device);
  Communicator& comm = peer_memory_communicator(peers, device);
  const int world = comm.world(), rank = comm.rank();
  TORCH_CHECK((split == 0 ? A.size(0) : B.size(1)) % world == 0,
              "symmpool fused ops: the split dim does not divide by the group size ", world);
  WorkspaceUse use(workspace, device);
  if (reduce_scatter_in_one_shot(split, A.size(0) * B.size(1) * A.element_size(), A.scalar_type(), how))
    return matmul_then_reduce_scatter(comm, use, A, B, how);
  const CUDAStream &main = use.main(), &copies = use.copies();
  const std::int64_t rows = split == 0 ? A.size(0) / world : A.size(0);
  const std::int64_t cols = split == 0 ? B.size(1) : B.size(1) / world;
  auto produce = [&](int dst, const at::Tensor& out) {
    if (split == 0)
      mm_into(out, A.narrow(0, dst * rows, rows), B);
    else
      mm_into(out, A, B.narrow(1, dst * cols, cols));
  };
  const at::Tensor stacked = staging(use.buffer(), {world, rows, cols}, A.scalar_type());
  const std::size_t chunk_bytes = static_cast<std::size_t>(rows * cols) * A.element_size();

  // Every peer is done with its workspace's last use: pushes (on the copy
  // stream, behind the meeting) may write into it; the first chunk's matmul
  // does not wait for the meeting.
  use.fork();
  meet(comm, copies);
  const int slots = world - 1 < 2 ? world - 1 : 2;
  std::vector<at::Tensor> buffers;
  for (int i = 0; i < slots; ++i) buffers.push_back(at::empty({rows, cols}, A.options()));
  std::array<bool, 2> in_flight{false, false};
  void* my_slot = stacked[rank].data_ptr();
  for (int step = 1; step < world; ++step) {
    const int dst = (rank + step) % world, slot = step % slots;
    if (in_flight[slot]) workspace.pushed[slot].block(main);  // the copy engines are done with this buffer
    produce(dst, buffers[slot]);
    wait_stream(copies, main, use.joined());
    void* remote = call_translating_errors([&] { return comm.peer_address(my_slot, chunk_bytes, dst); });
    copy_bytes(remote, buffers[slot].data_ptr(), chunk_bytes, copies);
    workspace.pushed[slot].record(copies);
    in_flight[slot] = true;
  }
  produce(rank, stacked[rank]);
  wait_stream(main, copies, use.joined());
  // Every push has landed, everywhere.
  meet(comm, main);
  at::Tensor out = combine(stacked, how);
  use.finish();
  return out;
}

void define_fused_pipelines(py::module& m) {
  m.def("_tp_one_shot_bytes", &one_shot_bytes,
        "SYMMPOOL_TP_ONE_SHOT_BYTES as the fused ops read it (ValueError when it is not a size).");
  py::class_<FusedWorkspace, std::shared_ptr<FusedWorkspace>>(
      m, "FusedWorkspace",
      "A group's fused-op workspace on one device: its buffer, its copy stream, and "
      "where the last op left it.")
      .def_property_readonly(
          "buffer",
          [](const FusedWorkspace& ws) { return ws.buffer.defined() ? py::cast(ws.buffer) : py::none(); },
          "The rendezvoused uint8 buffer, or None before the first growth.")
      .def_readonly("id", &FusedWorkspace::id, "Unique in the process: a replaced workspace has a new one.")
      .def_readonly("captured", &FusedWorkspace::captured,
                    "Whether a CUDA graph captured an op on the current buffer (it must outlive the graph).");
  m.def(
      "_all_gather_matmul",
      [](const std::string& group_name, const at::Tensor& x, const std::vector<at::Tensor>& Bs,
         std::int64_t gather_dim, FusedWorkspace& workspace) {
        auto peers = require_peer_group(group_name, x.device().index(), "_all_gather_matmul");
        return all_gather_matmul(*peers, x, Bs, gather_dim, workspace);
      },
      py::arg("group_name"), py::arg("x"), py::arg("Bs"), py::arg("gather_dim"), py::arg("workspace"),
      py::call_guard<py::gil_scoped_release>(),
      "Enqueues a fused all-gather of x [m, k] along gather_dim through the workspace, each shard "
      "multiplied as it arrives; returns (A [world * m, k] for dim 0, or the shards [world, m, k] for "
      "dim 1; [A @ B for B in Bs]).");
  m.def(
      "_produce_and_all_to_all",
      [](const std::string& group_name, const at::Tensor& A, const at::Tensor& B, std::int64_t split,
         FusedWorkspace& workspace, const std::string& combine) {
        auto peers = require_peer_group(group_name, A.device().index(), "_produce_and_all_to_all");
        return produce_and_all_to_all(*peers, A, B, split, workspace, combine);
      },
      py::arg("group_name"), py::arg("A"), py::arg("B"), py::arg("split"), py::arg("workspace"),
      py::arg("combine"), py::call_guard<py::gil_scoped_release>(),
      "Enqueues rank d's chunk (rows d of A @ B for split 0, A @ B's column block d for split 1) pushed "
      "into rank d's workspace slot; returns the slots (slot s from rank s) summed ('sum') or averaged "
      "('avg') into [rows, cols], or all of them copied ('none', [world, rows, cols]).");
}

}  // namespace symmpool::torch_ext
