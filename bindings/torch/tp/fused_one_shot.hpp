#pragma once
// The fused ops in one step, for calls small enough that the host's time
// bounds them: the group's own collective over the workspace (one kernel
// that meets the peers inside, at these sizes) and one matmul per product
// (fused_pipelines.cpp picks by size, one_shot_bytes()).

#include "tp/fused_steps.hpp"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace symmpool::torch_ext {

// Whether an all-gather of `shard_bytes` a rank over `world` ranks runs in
// one step (along rows only: along K the shards are accumulated).
inline bool all_gather_in_one_shot(bool rows, int world, std::int64_t shard_bytes) {
  return rows && world * shard_bytes <= one_shot_bytes();
}

// Whether a product of `product_bytes` of `dtype`, reduce-scattered along
// `split` (0: rows, 1: columns) by `how` ("sum", "avg"; "none" is an
// all-to-all), runs in one step: along rows (a column block is not
// contiguous), a sum or mean, in a type symmpool reduces.
bool reduce_scatter_in_one_shot(std::int64_t split, std::int64_t product_bytes, at::ScalarType dtype,
                                const std::string& how);

// all-gather of x [m, k] along rows into A [world * m, k], then one matmul
// per B over all of A. Returns (A, [A @ B for B in Bs]).
std::tuple<at::Tensor, std::vector<at::Tensor>> all_gather_then_matmul(Communicator& comm, WorkspaceUse& use,
                                                                       const at::Tensor& x, at::TensorList Bs,
                                                                       HostSteps& steps);

// A @ B in one matmul into the workspace, then reduce-scattered along rows
// (rank d gets rows d, summed or averaged over the ranks as `how` says).
at::Tensor matmul_then_reduce_scatter(Communicator& comm, WorkspaceUse& use, const at::Tensor& A,
                                      const at::Tensor& B, const std::string& how);

}  // namespace symmpool::torch_ext
