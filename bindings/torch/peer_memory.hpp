#pragma once
// symmpool._C's peer-memory functions (symmpool/peer_memory.py wraps them):
// symmetric buffers of a "symm" group, views of the peers' copies, barriers
// and point-to-point signals on the group's communicator.

#include <pybind11/pybind11.h>

namespace symmpool::torch_ext {

void define_peer_memory(pybind11::module& m);

}  // namespace symmpool::torch_ext
