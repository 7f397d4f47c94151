#include "tp/peer_memory.hpp"

#include "torch_errors.hpp"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/from_blob.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <optional>
#include <string>

namespace py = pybind11;

namespace symmpool::torch_ext {

namespace {

c10::DeviceIndex cuda_device_of(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.is_cuda(), "symmpool ", op, ": the tensor must be on a CUDA device, got ", t.device());
  return t.device().index();
}

// The tensor's CUDA device, or -1 (require_peer_group names the error).
c10::DeviceIndex device_or_none(const at::Tensor& t) { return t.is_cuda() ? t.device().index() : -1; }

// Bytes from the tensor's first element to one past its last.
std::size_t span_bytes(const at::Tensor& t) {
  return t.numel() == 0 ? 0 : at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.itemsize());
}

cudaStream_t stream_or_current(std::optional<std::int64_t> stream, c10::DeviceIndex device) {
  if (stream) return reinterpret_cast<cudaStream_t>(static_cast<std::intptr_t>(*stream));
  return c10::cuda::getCurrentCUDAStream(device).stream();
}

}  // namespace

Communicator& peer_memory_communicator(PeerGroup& peers, c10::DeviceIndex device) {
  Communicator* comm = call_translating_errors([&] { return peers.peer_memory(device); });
  TORCH_CHECK(
      comm != nullptr,
      "symmpool peer memory: this group spans nodes; peers' memory can be mapped within one node only");
  return *comm;
}

std::string rendezvous_or_why_not(PeerGroup& peers, const at::Tensor& t) {
  const c10::DeviceIndex device = cuda_device_of(t, "rendezvous");
  const std::size_t bytes = span_bytes(t);
  TORCH_CHECK(bytes > 0, "symmpool rendezvous: the tensor is empty");
  Communicator& comm = peer_memory_communicator(peers, device);
  c10::cuda::CUDAGuard guard(device);
  return call_translating_errors([&]() -> std::string {
    try {
      comm.rendezvous(t.data_ptr(), bytes, c10::cuda::getCurrentCUDAStream(device).stream());
      peers.rendezvoused_storages().add(t);
      return {};
    } catch (const not_symmetric_error& e) {
      return e.what();  // the same verdict on every rank
    }
  });
}

void define_peer_memory(py::module& m) {
  m.def(
      "_peer_memory_available",
      [](const std::string& group_name, c10::DeviceIndex device) {
        std::shared_ptr<PeerGroup> peers = peer_group_of(group_name, device);
        return peers && call_translating_errors([&] { return peers->peer_memory(device) != nullptr; });
      },
      py::arg("group_name"), py::arg("device"), py::call_guard<py::gil_scoped_release>(),
      "Collective the first time: whether the group's ranks share a node (every rank gets the same answer).");
  m.def(
      "_rendezvous",
      [](const std::string& group_name, const at::Tensor& t) {
        return rendezvous_or_why_not(*require_peer_group(group_name, device_or_none(t), "rendezvous"), t);
      },
      py::arg("group_name"), py::arg("tensor"), py::call_guard<py::gil_scoped_release>(),
      "Collective: '' when the tensor's bytes sit at the same offset in every rank's heap (peer_tensor "
      "may then view them), otherwise why not (the same text on every rank).");
  m.def(
      "_peer_tensor",
      [](const std::string& group_name, const at::Tensor& t, int peer) {
        std::shared_ptr<PeerGroup> peers = require_peer_group(group_name, device_or_none(t), "peer_tensor");
        const c10::DeviceIndex device = cuda_device_of(t, "peer_tensor");
        const std::size_t bytes = span_bytes(t);
        // Local checks first: the communicator below is made by a collective
        // call where the group has none yet, and this call is not one.
        TORCH_CHECK(bytes == 0 || peers->rendezvoused_storages().contains(t),
                    "symmpool peer_tensor: this tensor's storage did not go through rendezvous on this group "
                    "(a tensor freed and allocated again at the same address needs its own rendezvous); call "
                    "symmpool.rendezvous on it on every rank first");
        TORCH_CHECK_INDEX(peer >= 0 && peer < peers->group_size(), "symmpool peer_tensor: peer ", peer,
                          " is not a rank of this group of ", peers->group_size());
        // An empty view touches no memory: nothing to set up for it.
        auto [remote, lease] =
            bytes == 0
                ? std::pair<void*, std::shared_ptr<void>>{t.data_ptr(), nullptr}
                : call_translating_errors([&] {
                    return peer_memory_communicator(*peers, device).peer_view(t.data_ptr(), bytes, peer);
                  });
        // target_device: the memory is the peer's, mapped into this device's
        // address space; torch must not ask the pointer which device it is on.
        // The view holds the mapping: it outlives the group, or the peer's
        // release, readable (the last holder unmaps it).
        return at::for_blob(remote, t.sizes())
            .strides(t.strides())
            .options(t.options())
            .target_device(t.device())
            .deleter([lease = std::move(lease)](void*) {})
            .make_tensor();
      },
      py::arg("group_name"), py::arg("tensor"), py::arg("peer"), py::call_guard<py::gil_scoped_release>(),
      "A view of `peer`'s copy of a rendezvoused tensor (same shape, strides and dtype).");
  m.def(
      "_barrier",
      [](const std::string& group_name, c10::DeviceIndex device, std::optional<std::int64_t> stream) {
        Communicator& comm =
            peer_memory_communicator(*require_peer_group(group_name, device, "barrier"), device);
        c10::cuda::CUDAGuard guard(device);
        call_translating_errors([&] {
          comm.barrier(stream_or_current(stream, device), BarrierKind::kStreamOps);
          return 0;
        });
      },
      py::arg("group_name"), py::arg("device"), py::arg("stream") = py::none(),
      py::call_guard<py::gil_scoped_release>());
  // signal and wait: the same call to a different Communicator member.
  auto point_to_point = [](void (Communicator::*op)(int, cudaStream_t)) {
    return [op](const std::string& group_name, c10::DeviceIndex device, int peer,
                std::optional<std::int64_t> stream) {
      std::shared_ptr<PeerGroup> peers = require_peer_group(group_name, device, "signal/wait");
      // Point to point: two ranks of the group cannot set it up for all.
      TORCH_CHECK(peers->peer_memory_formed(),
                  "symmpool signal/wait: this group's peer memory is not set up yet; call "
                  "symmpool.is_available, rendezvous or barrier on every rank of the group first");
      Communicator& comm = peer_memory_communicator(*peers, device);
      c10::cuda::CUDAGuard guard(device);
      call_translating_errors([&] {
        (comm.*op)(peer, stream_or_current(stream, device));
        return 0;
      });
    };
  };
  for (const auto& [name, op] : {std::pair{"_signal", &Communicator::signal}, {"_wait", &Communicator::wait}})
    m.def(name, point_to_point(op), py::arg("group_name"), py::arg("device"), py::arg("peer"),
          py::arg("stream") = py::none(), py::call_guard<py::gil_scoped_release>());
}

}  // namespace symmpool::torch_ext
