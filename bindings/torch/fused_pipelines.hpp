#pragma once
// symmpool._C's fused tensor-parallel pipelines (symmpool/fused_ops.py
// decides when to use them): one C++ call enqueues a fused op's copies,
// matmuls and barriers.

#include <pybind11/pybind11.h>

namespace symmpool::torch_ext {

void define_fused_pipelines(pybind11::module& m);

}  // namespace symmpool::torch_ext
