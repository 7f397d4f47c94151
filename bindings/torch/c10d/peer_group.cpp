#include "c10d/peer_group.hpp"

#include "c10d/group_symmetry.hpp"
#include "c10d/symm_backend.hpp"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <atomic>

namespace symmpool::torch_ext {

namespace {
std::atomic<std::uint64_t> next_serial{1};
}  // namespace

PeerGroup::PeerGroup() : serial_(next_serial.fetch_add(1)) {}

std::shared_ptr<PeerGroup> peer_group_of(const std::string& group_name, c10::DeviceIndex device) {
  return peer_group_of(*c10d::resolve_process_group(group_name), device);
}

std::shared_ptr<PeerGroup> peer_group_of(c10d::ProcessGroup& group, c10::DeviceIndex device) {
  c10::intrusive_ptr<c10d::Backend> backend = cuda_backend_of(group);
  if (auto* symm = dynamic_cast<SymmBackend*>(backend.get())) {
    // The handle holds the backend: a "symm" group's state lives in it.
    return std::shared_ptr<PeerGroup>(symm, [held = std::move(backend)](PeerGroup*) {});
  }
  if (!dynamic_cast<c10d::ProcessGroupNCCL*>(backend.get())) return {};
  return group_symmetry(group, device);
}

namespace {

// Whether the group's CUDA backend is one peer_group_of serves ("symm" is a ProcessGroupNCCL too).
bool has_peer_side(c10d::ProcessGroup& group) {
  return dynamic_cast<c10d::ProcessGroupNCCL*>(cuda_backend_of(group).get()) != nullptr;
}

}  // namespace

std::shared_ptr<PeerGroup> require_peer_group(const std::string& group_name, c10::DeviceIndex device,
                                              const char* op) {
  auto group = c10d::resolve_process_group(group_name);
  // The group first: a CPU tensor on a gloo group is a wrong group before it is a wrong device.
  TORCH_CHECK_TYPE(has_peer_side(*group), "symmpool ", op,
                   " needs a group whose CUDA backend is \"nccl\" or \"symm\"; group '", group_name,
                   "' has neither");
  TORCH_CHECK(device >= 0, "symmpool ", op, ": the tensor must be on a CUDA device");
  return peer_group_of(*group, device);
}

}  // namespace symmpool::torch_ext
