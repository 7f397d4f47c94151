#pragma once
// The fused ops in one step, for calls small enough that the host's time
// bounds them: every shard moved at once, one matmul per product, the same
// two meetings as the shard-by-shard pipelines (fused_pipelines.cpp picks
// by size, one_shot_bytes()).

#include "fused_steps.hpp"

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

// Whether a product of `product_bytes`, split among the ranks along `split`
// (0: rows, 1: columns), is made and sent in one step (rows only: a
// column block is not contiguous).
inline bool all_to_all_in_one_shot(std::int64_t split, std::int64_t product_bytes) {
  return split == 0 && product_bytes <= one_shot_bytes();
}

// all-gather of x [m, k] along rows: every rank's shard pulled into A
// [world * m, k], then one matmul per B over all of A. Returns (A, [A @ B
// for B in Bs]).
std::tuple<at::Tensor, std::vector<at::Tensor>> all_gather_then_matmul(Communicator& comm, WorkspaceUse& use,
                                                                       const at::Tensor& x, at::TensorList Bs,
                                                                       HostSteps& steps);

// A @ B in one matmul, then its rows d (chunk d) pushed into rank d's
// workspace slot; returns the slots combined as `how` says (combine()).
at::Tensor produce_then_all_to_all(Communicator& comm, WorkspaceUse& use, const at::Tensor& A,
                                   const at::Tensor& B, const std::string& how);

}  // namespace symmpool::torch_ext
