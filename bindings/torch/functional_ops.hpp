#pragma once
// symmpool._C's functional collectives (torch.ops.symmpool.all_gather,
// reduce_scatter, all_reduce): their C++ kernels, registered once
// symmpool/ops.py has defined the schemas.

#include <pybind11/pybind11.h>

namespace symmpool::torch_ext {

void define_functional_ops(pybind11::module& m);

}  // namespace symmpool::torch_ext
