#include "peer_memory.hpp"

#include "symm_backend.hpp"
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

SymmBackend& symm_backend(const c10::intrusive_ptr<c10d::Backend>& backend) {
  auto* symm = dynamic_cast<SymmBackend*>(backend.get());
  if (symm == nullptr)
    throw py::type_error("symmpool peer memory needs a \"symm\" process group, got a \"" +
                         backend->getBackendName() + "\" one");
  return *symm;
}

c10::DeviceIndex cuda_device_of(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.is_cuda(), "symmpool ", op, ": the tensor must be on a CUDA device, got ", t.device());
  return t.device().index();
}

// Bytes from the tensor's first element to one past its last.
std::size_t span_bytes(const at::Tensor& t) {
  return t.numel() == 0 ? 0 : at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.itemsize());
}

cudaStream_t stream_or_current(std::optional<std::int64_t> stream, c10::DeviceIndex device) {
  if (stream) return reinterpret_cast<cudaStream_t>(static_cast<std::intptr_t>(*stream));
  return c10::cuda::getCurrentCUDAStream(device).stream();
}

}  // namespace

Communicator& peer_memory_communicator(const c10::intrusive_ptr<c10d::Backend>& backend,
                                       c10::DeviceIndex device) {
  Communicator* comm = symm_backend(backend).peer_memory(device);
  TORCH_CHECK(
      comm != nullptr,
      "symmpool peer memory: this group spans nodes; peers' memory can be mapped within one node only");
  return *comm;
}

std::string rendezvous_or_why_not(const c10::intrusive_ptr<c10d::Backend>& backend, const at::Tensor& t) {
  const c10::DeviceIndex device = cuda_device_of(t, "rendezvous");
  const std::size_t bytes = span_bytes(t);
  TORCH_CHECK(bytes > 0, "symmpool rendezvous: the tensor is empty");
  Communicator& comm = peer_memory_communicator(backend, device);
  c10::cuda::CUDAGuard guard(device);
  return call_translating_errors([&]() -> std::string {
    try {
      comm.rendezvous(t.data_ptr(), bytes, c10::cuda::getCurrentCUDAStream(device).stream());
      symm_backend(backend).rendezvoused_storages().add(t);
      return {};
    } catch (const not_symmetric_error& e) {
      return e.what();  // the same verdict on every rank
    }
  });
}

void define_peer_memory(py::module& m) {
  m.def(
      "_peer_memory_available",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, c10::DeviceIndex device) {
        return call_translating_errors([&] { return symm_backend(backend).peer_memory(device) != nullptr; });
      },
      py::arg("backend"), py::arg("device"), py::call_guard<py::gil_scoped_release>(),
      "Collective the first time: whether the group's ranks share a node (every rank gets the same answer).");
  m.def("_rendezvous", &rendezvous_or_why_not, py::arg("backend"), py::arg("tensor"),
        py::call_guard<py::gil_scoped_release>(),
        "Collective: '' when the tensor's bytes sit at the same offset in every rank's heap (peer_tensor "
        "may then view them), otherwise why not (the same text on every rank).");
  m.def(
      "_peer_tensor",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, const at::Tensor& t, int peer) {
        const c10::DeviceIndex device = cuda_device_of(t, "peer_tensor");
        const std::size_t bytes = span_bytes(t);
        // Local checks first: the communicator below is made by a collective
        // call where the group has none yet, and this call is not one.
        TORCH_CHECK(bytes == 0 || symm_backend(backend).rendezvoused_storages().contains(t),
                    "symmpool peer_tensor: this tensor's storage did not go through rendezvous on this group "
                    "(a tensor freed and allocated again at the same address needs its own rendezvous); call "
                    "symmpool.rendezvous on it on every rank first");
        TORCH_CHECK_INDEX(peer >= 0 && peer < backend->getSize(), "symmpool peer_tensor: peer ", peer,
                          " is not a rank of this group of ", backend->getSize());
        // An empty view touches no memory: nothing to set up for it.
        auto [remote, lease] =
            bytes == 0
                ? std::pair<void*, std::shared_ptr<void>>{t.data_ptr(), nullptr}
                : call_translating_errors([&] {
                    return peer_memory_communicator(backend, device).peer_view(t.data_ptr(), bytes, peer);
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
      py::arg("backend"), py::arg("tensor"), py::arg("peer"),
      "A view of `peer`'s copy of a rendezvoused tensor (same shape, strides and dtype).");
  m.def(
      "_barrier",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, c10::DeviceIndex device,
         std::optional<std::int64_t> stream) {
        Communicator& comm = peer_memory_communicator(backend, device);
        c10::cuda::CUDAGuard guard(device);
        call_translating_errors([&] {
          comm.barrier(stream_or_current(stream, device), BarrierKind::kStreamOps);
          return 0;
        });
      },
      py::arg("backend"), py::arg("device"), py::arg("stream") = py::none(),
      py::call_guard<py::gil_scoped_release>());
  // signal and wait: the same call to a different Communicator member.
  auto point_to_point = [](void (Communicator::*op)(int, cudaStream_t)) {
    return [op](const c10::intrusive_ptr<c10d::Backend>& backend, c10::DeviceIndex device, int peer,
                std::optional<std::int64_t> stream) {
      // Point to point: two ranks of the group cannot set it up for all.
      TORCH_CHECK(symm_backend(backend).peer_memory_formed(),
                  "symmpool signal/wait: this group's peer memory is not set up yet; call "
                  "symmpool.is_available, rendezvous or barrier on every rank of the group first");
      Communicator& comm = peer_memory_communicator(backend, device);
      c10::cuda::CUDAGuard guard(device);
      call_translating_errors([&] {
        (comm.*op)(peer, stream_or_current(stream, device));
        return 0;
      });
    };
  };
  for (const auto& [name, op] : {std::pair{"_signal", &Communicator::signal}, {"_wait", &Communicator::wait}})
    m.def(name, point_to_point(op), py::arg("backend"), py::arg("device"), py::arg("peer"),
          py::arg("stream") = py::none(), py::call_guard<py::gil_scoped_release>());
}

}  // namespace symmpool::torch_ext
