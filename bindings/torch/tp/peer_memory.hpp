#pragma once
// symmpool._C's peer-memory functions (symmpool/peer_memory.py wraps them):
// symmetric buffers of a "symm" or plain NCCL group, views of the peers'
// copies, barriers and point-to-point signals on the group's communicator.

#include "c10d/peer_group.hpp"

#include <symmpool/communicator.hpp>

#include <c10/core/Device.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <string>

namespace symmpool::torch_ext {

void define_peer_memory(pybind11::module& m);

// The group's communicator on `device` (collective the first time);
// RuntimeError where the group spans nodes.
Communicator& peer_memory_communicator(PeerGroup& peers, c10::DeviceIndex device);

// Collective: '' when `t`'s bytes sit at the same offset in every rank's heap
// (peer_tensor may then view them), otherwise why not (the same text on
// every rank).
std::string rendezvous_or_why_not(PeerGroup& peers, const at::Tensor& t);

}  // namespace symmpool::torch_ext
