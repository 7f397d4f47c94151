#pragma once
// symmpool._C's fused tensor-parallel ops: their C++ kernels (registered
// once symmpool/fused_ops.py has defined the schemas), their counts, and the
// workspace's reservation.

#include <pybind11/pybind11.h>

namespace symmpool::torch_ext {

void define_fused_ops(pybind11::module& m);

}  // namespace symmpool::torch_ext
