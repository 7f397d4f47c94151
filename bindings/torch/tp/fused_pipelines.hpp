#pragma once
// The fused tensor-parallel ops' pipelines (fused_ops.cpp decides when to
// use them): one C++ call enqueues a fused op's copies, matmuls and
// barriers through the group's workspace.

#include "tp/fused_workspace.hpp"

#include <ATen/ATen.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace symmpool::torch_ext {

// all-gather of x [m, k] along gather_dim (0: rows, 1: columns), each
// rank's shard multiplied by every B as soon as it has arrived. Returns
// (A [world * m, k] for dim 0, or the shards stacked [world, m, k] for dim
// 1; [A @ B for B in Bs]).
std::tuple<at::Tensor, std::vector<at::Tensor>> all_gather_matmul(PeerGroup& peers, const at::Tensor& x,
                                                                  at::TensorList Bs, std::int64_t gather_dim,
                                                                  FusedWorkspace& workspace);

// Rank d's chunk (rows d of A @ B for split 0, A @ B's column block d for
// split 1) pushed into rank d's workspace slot; returns the slots (slot s
// from rank s) summed ("sum") or averaged ("avg") into [rows, cols], or all
// of them copied ("none", [world, rows, cols]).
at::Tensor produce_and_all_to_all(PeerGroup& peers, const at::Tensor& A, const at::Tensor& B,
                                  std::int64_t split, FusedWorkspace& workspace, const std::string& how);

// symmpool._C's handles on them (benches time the pipelines alone).
void define_fused_pipelines(pybind11::module& m);

}  // namespace symmpool::torch_ext
