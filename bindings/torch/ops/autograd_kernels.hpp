#pragma once
// The Autograd kernels of symmpool's ops: none has a derivative, so a
// backward through an output, or through an input an op mutated, must raise
// instead of handing back silently wrong gradients.

#include <string>

namespace symmpool::torch_ext {

// Registers the Autograd kernel of symmpool::<name> (defined already):
// torch's autogradNotImplementedFallback for an op that returns its results;
// for one that mutates an input, mutating_op_autograd (below).
void register_autograd_not_implemented(const std::string& name);

}  // namespace symmpool::torch_ext
