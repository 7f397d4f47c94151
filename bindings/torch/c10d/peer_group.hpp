#pragma once
// What the peer-memory API and the fused TP ops need of a process group,
// whichever way symmpool came to it: the "symm" backend (symm_backend.hpp)
// or a plain NCCL group's GroupSymmetry (group_symmetry.hpp). Both form the
// group's heap and communicator on first use, collectively, over the
// group's own store.

#include "c10d/rendezvoused_storages.hpp"

#include <symmpool/communicator.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/TensorOptions.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace symmpool::torch_ext {

class PeerGroup {
 public:
  PeerGroup();
  virtual ~PeerGroup() = default;
  PeerGroup(const PeerGroup&) = delete;
  PeerGroup& operator=(const PeerGroup&) = delete;

  // The group's communicator on `device`, made by the first call
  // (collective); null, on every rank, where the group spans nodes. Raises
  // the group's sticky failure, if any.
  virtual Communicator* peer_memory(c10::DeviceIndex device) = 0;
  // Whether peer_memory has been decided (made, or found to span nodes):
  // calls that are not collective (signal, wait) cannot set the group up.
  virtual bool peer_memory_formed() const = 0;
  // A 1-D tensor of `size` elements in symmpool's memory, freed in stream
  // order on the current stream.
  virtual at::Tensor allocate_symmetric(long size, at::TensorOptions options) = 0;
  virtual int group_rank() const = 0;
  virtual int group_size() const = 0;

  // The storages whose rendezvous on this group succeeded.
  RendezvousedStorages& rendezvoused_storages() { return rendezvoused_storages_; }
  // Unique in the process, never reused: state kept per group (the fused
  // ops' workspaces, Python's) is keyed on it, since a new group may come
  // under an old name or at an old address.
  std::uint64_t serial() const { return serial_; }

 private:
  RendezvousedStorages rendezvoused_storages_;
  const std::uint64_t serial_;
};

// The peer side of the group named `group_name` on `device`: its "symm"
// backend, or for a group whose CUDA backend is NCCL its GroupSymmetry
// (made here, formed on first use); null where the group has no CUDA
// backend or another one. The handle keeps it alive through a call even if
// the group is released meanwhile.
std::shared_ptr<PeerGroup> peer_group_of(const std::string& group_name, c10::DeviceIndex device);
std::shared_ptr<PeerGroup> peer_group_of(c10d::ProcessGroup& group, c10::DeviceIndex device);

// The same, raising a TypeError that names `op` where there is none.
std::shared_ptr<PeerGroup> require_peer_group(const std::string& group_name, c10::DeviceIndex device,
                                              const char* op);

}  // namespace symmpool::torch_ext
