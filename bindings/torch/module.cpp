// symmpool._C: the "symm" backend factory, allocator and routing statistics.

#include "allocator/process_allocator.hpp"
#include "c10d/c10d_store.hpp"
#include "c10d/group_symmetry.hpp"
#include "c10d/symm_backend.hpp"
#include "c10d/symmetric_tensor.hpp"
#include "c10d/window_staging.hpp"
#include "ops/autograd_kernels.hpp"
#include "ops/functional_ops.hpp"
#include "torch_errors.hpp"
#include "tp/fused_ops.hpp"
#include "tp/fused_pipelines.hpp"
#include "tp/peer_memory.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/device_allocators.hpp>
#include <symmpool/peer_mapping.hpp>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <vector>

namespace py = pybind11;
using symmpool::torch_ext::call_translating_errors;
using symmpool::torch_ext::SymmBackend;

namespace {

py::dict stat_dict(const symmpool::Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  return d;
}

// Queries look at the allocator of `device` only if the process made one:
// creating it would make a CUDA context and reserve address space on a device
// the process may never use. A device without one has zero stats.
symmpool::CachingAllocator* existing_allocator(int device) {
  return call_translating_errors([&] { return symmpool::existing_device_allocator(device); });
}

py::dict memory_stats(int device) {
  symmpool::CachingAllocator* allocator = existing_allocator(device);
  auto st =
      allocator ? call_translating_errors([&] { return allocator->stats(); }) : symmpool::AllocatorStats{};
  auto reg = symmpool::torch_ext::registration_counts_of_all_backends();
  py::dict d;
  d["allocated_bytes"] = stat_dict(st.allocated_bytes);
  d["requested_bytes"] = stat_dict(st.requested_bytes);
  d["reserved_bytes"] = stat_dict(st.reserved_bytes);
  d["active_blocks"] = stat_dict(st.active_blocks);
  d["segments"] = stat_dict(st.segments);
  d["allocations"] = st.allocations;
  d["frees"] = st.frees;
  d["cache_hits"] = st.cache_hits;
  d["cache_misses"] = st.cache_misses;
  d["segment_maps"] = st.segment_maps;
  d["segment_unmaps"] = st.segment_unmaps;
  d["outgrown_segment_releases"] = st.outgrown_segment_releases;
  d["segment_stream_moves"] = st.segment_stream_moves;
  d["graph_held_bytes"] = symmpool::torch_ext::graph_held_bytes(static_cast<c10::DeviceIndex>(device));
  // Peer mappings no heap or view needs, still mapped until a sync waits for the device.
  d["retired_peer_mappings"] = allocator ? symmpool::retired_peer_mappings(allocator->context()) : 0;
  d["oom_retries"] = st.oom_retries;
  d["ooms"] = st.ooms;
  d["nccl_registrations"] = reg.registrations;
  d["nccl_deregistrations"] = reg.deregistrations;
  d["nccl_failed_deregistrations"] = reg.failed_deregistrations;
  d["nccl_abandoned_registrations"] = reg.abandoned;
  d["nccl_registered_segments"] = reg.live;
  d["nccl_registered_bytes"] = reg.live_bytes;
  // NCCL's symmetric windows over the heaps' symmetric segments.
  auto win = symmpool::torch_ext::window_counts_of_all_backends();
  d["nccl_windows"] = win.live;                                        // of the live groups
  d["nccl_windows_in_process"] = symmpool::nccl_windows_in_process();  // groups being torn down too
  d["nccl_window_bytes"] = win.live_bytes;
  d["nccl_window_registrations"] = win.registrations;
  d["nccl_window_deregistrations"] = win.deregistrations;
  d["nccl_window_failed_deregistrations"] = win.failed_deregistrations;
  d["nccl_window_refusals"] = win.refusals;
  d["nccl_window_abandoned"] = win.abandoned;
  d["nccl_window_register_ns"] = win.register_ns;
  d["nccl_window_longest_register_ns"] = win.longest_register_ns;
  auto coll = symmpool::torch_ext::collective_counts();
  d["symm_collectives"] = coll.routed;
  d["nccl_window_collectives"] = coll.on_nccl_windows;
  d["nccl_fallbacks"] = coll.fallbacks;
  // NCCL calls whose window tensors went through plain copies (not checked symmetric).
  d["staged_nccl_calls"] = symmpool::torch_ext::staged_nccl_calls();
  // Host round trips to the peers (symmetry verdicts, call checks, syncs), process-wide.
  d["heap_exchanges"] = symmpool::heap_exchanges();
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "symmpool: symmetric, NCCL-registered CUDA memory for PyTorch";
  py::module::import("torch.distributed");  // registers the c10d types we take and return

  // Python sees a "symm" backend as the ProcessGroupNCCL it is, so torch's
  // group splitting finds its NCCL methods (perform_nocolor_split on ranks
  // outside a new group, split_from on ranks inside).
  py::class_<SymmBackend, c10d::ProcessGroupNCCL, c10::intrusive_ptr<SymmBackend>>(
      m, "SymmBackend", "ProcessGroupNCCL whose tensors and collectives may come from symmpool")
      .def_property_readonly(
          "serial", [](const SymmBackend& backend) { return backend.serial(); },
          "Unique in the process and never reused: what per-backend state is keyed on "
          "(Python wrappers of one backend come and go).");

  m.def(
      "_create_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         const c10::intrusive_ptr<c10d::ProcessGroupNCCL::Options>& options)
          -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<SymmBackend>(store, rank, size, options);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("options"),
      py::call_guard<py::gil_scoped_release>());

  m.def("memory_stats", &memory_stats, py::arg("device"));

  // symmpool under a group whose CUDA backend is plain NCCL (group_symmetry.hpp):
  // True where symmpool ran the call on the current stream, False where the
  // caller must run it on the group's own backend (the same on every rank).
  using symmpool::torch_ext::group_symmetry;
  auto reduce_op = [](const std::string& op) {
    TORCH_CHECK(op == "sum" || op == "avg", "symmpool: reduce op must be sum or avg, got ", op);
    return op == "sum" ? c10d::ReduceOp::SUM : c10d::ReduceOp::AVG;
  };
  m.def(
      "group_all_gather",
      [](const std::string& group, at::Tensor output, at::Tensor input) {
        return static_cast<bool>(group_symmetry(group, input.device().index())->all_gather(output, input));
      },
      py::arg("group_name"), py::arg("output"), py::arg("input"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "group_reduce_scatter",
      [reduce_op](const std::string& group, at::Tensor output, at::Tensor input, const std::string& op) {
        return static_cast<bool>(
            group_symmetry(group, input.device().index())->reduce_scatter(output, input, reduce_op(op)));
      },
      py::arg("group_name"), py::arg("output"), py::arg("input"), py::arg("op"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "group_all_reduce",
      [reduce_op](const std::string& group, at::Tensor tensor, const std::string& op) {
        return static_cast<bool>(
            group_symmetry(group, tensor.device().index())->all_reduce(tensor, reduce_op(op)));
      },
      py::arg("group_name"), py::arg("tensor"), py::arg("op"), py::call_guard<py::gil_scoped_release>());
  m.def("release_group", &symmpool::torch_ext::release_group_symmetry, py::arg("group_name"),
        py::call_guard<py::gil_scoped_release>(),
        "Drops a plain group's symmetric heap and communicator (False where it had none).");
  m.def(
      "empty_symmetric",
      [](std::int64_t numel, at::ScalarType dtype, at::Device device) {
        return symmpool::torch_ext::empty_symmetric(numel, at::TensorOptions().dtype(dtype).device(device));
      },
      py::arg("numel"), py::arg("dtype"), py::arg("device"),
      "A 1-D tensor in symmpool's memory, freed in stream order on the current stream.");
  m.def(
      "reset_peak_memory_stats",
      [](int device) {
        if (symmpool::CachingAllocator* allocator = existing_allocator(device)) allocator->reset_peak_stats();
      },
      py::arg("device"));
  m.def(
      "empty_cache",
      [](int device) -> std::size_t {
        symmpool::CachingAllocator* allocator = existing_allocator(device);
        return allocator ? call_translating_errors([&] { return allocator->empty_cache(); }) : 0;
      },
      py::arg("device"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "owns",
      [](const at::Tensor& t) {
        if (!t.is_cuda() || t.data_ptr() == nullptr) return false;
        symmpool::CachingAllocator* allocator = existing_allocator(t.device().index());
        return allocator != nullptr && allocator->owns(t.data_ptr());
      },
      py::arg("tensor"));
  m.def(
      "multicast_status",
      [](int device) {
        const auto& mc = call_translating_errors([&]() -> const symmpool::MulticastDecision& {
          return symmpool::device_allocator(device).multicast();
        });
        return py::make_tuple(mc.enabled, mc.reason);
      },
      py::arg("device"));
  m.def(
      "routing_counts",
      [] {
        const auto counts = symmpool::torch_ext::routing_counts();
        py::dict d;
        for (int r = 0; r < symmpool::kRouteReasons; ++r)
          d[symmpool::to_string(static_cast<symmpool::RouteReason>(r))] = counts[r];
        return d;
      },
      "Collectives the symm backends of this process routed, by reason: where each ran and why "
      "(SYMMPOOL_DEBUG_ROUTING=1 prints each decision to stderr).");
  // The largest low-latency all-reduce in bytes, so tests size their calls
  // from it instead of from a copy of it.
  m.attr("LOW_LATENCY_MAX_BYTES") = symmpool::Communicator::kLowLatencyMaxBytes;
  // torch.__version__ of the torch this extension compiled against (bindings/torch/CMakeLists.txt).
  m.attr("BUILT_AGAINST_TORCH") = SYMMPOOL_TORCH_VERSION;
  m.def(
      "algorithm_counts",
      [] {
        const auto counts = symmpool::algorithm_counts();
        py::dict d;
        for (int a = 0; a < symmpool::kAlgorithmCount; ++a)
          d[symmpool::to_string(static_cast<symmpool::Algorithm>(a))] = counts[a];
        d.attr("pop")("auto");  // a choice, never what ran
        return d;
      },
      "symmpool collectives enqueued in this process, by the algorithm that ran them "
      "(SYMMPOOL_ALL_REDUCE_ALGORITHM and SYMMPOOL_REDUCE_SCATTER_ALGORITHM prefer one).");
  m.def(
      "_store_get",
      [](const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, int timeout_ms) {
        symmpool::torch_ext::C10dStore heap_store(store);
        return call_translating_errors(
            [&] { return heap_store.get(key, std::chrono::milliseconds(timeout_ms)); });
      },
      py::arg("store"), py::arg("key"), py::arg("timeout_ms"), py::call_guard<py::gil_scoped_release>(),
      "A key of a c10d store read as the symmetric heap reads it (tests: which error a late key and a "
      "gone store give).");
  m.def("_autograd_not_implemented", &symmpool::torch_ext::register_autograd_not_implemented, py::arg("name"),
        "Registers symmpool::<name>'s Autograd kernel in C++: it passes calls through, and a backward "
        "through its outputs, or through an input it mutated, raises (torch.library.custom_op's Python "
        "layers for the same cost a large share of a fused call's host time: symmpool/_library.py).");
  symmpool::torch_ext::define_peer_memory(m);
  symmpool::torch_ext::define_fused_pipelines(m);
  symmpool::torch_ext::define_process_allocator(m);
  symmpool::torch_ext::define_fused_ops(m);
  symmpool::torch_ext::define_functional_ops(m);
  m.def(
      "table_world_sizes",
      [] {
        std::vector<int> worlds;
        for (const symmpool::SymmpoolLimits& l : symmpool::kMeasuredLimits) worlds.push_back(l.world);
        return worlds;
      },
      "World sizes the algorithm table has measurements for; others run on NCCL by default.");
}
