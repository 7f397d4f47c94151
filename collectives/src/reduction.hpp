#pragma once
// One reduce_scatter or all_reduce as its algorithms (one_shot.cpp,
// two_shot.cpp, two_step.cpp, low_latency.cpp) see it, and what they share
// (reduction.cpp).

#include "kernels.hpp"

#include <symmpool/collective_types.hpp>
#include <symmpool/detail/algorithm_context.hpp>
#include <symmpool/detail/peer_pointers.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>

namespace symmpool::detail {

struct Reduction {
  const void* in;
  void* out;
  std::size_t count;  // elements each rank ends with in `out`
  DataType type;
  float scale;  // applied to the sum: 1 / world for an average
  cudaStream_t stream;

  std::size_t bytes() const { return count * element_size(type); }  // of `out`
};

// The part of an all-reduce's buffer that one rank reduces (two-shot,
// two-step): equal chunks of whole 16-byte vectors, in rank order.
struct ChunkOfRank {
  std::size_t first;   // elements before it
  std::size_t count;   // its elements: the last ranks' may be short or empty
  std::size_t stride;  // elements of a full chunk, equal on every rank
};

// What the two-step pipeline moves and reduces: this rank's chunk, as every
// rank's buffers hold it.
struct TwoStepChunk {
  PeerPointers sources{};  // rank p's copy of the chunk's input, as mapped here (ours: local)
  void* result = nullptr;  // where the reduced chunk lands here
  OutPointers pushes{};    // all_reduce: where it lands in every rank's output
  bool push = false;
  std::size_t count = 0;  // elements
};

// What multiplies the sum: 1 / world for an average.
float reduction_scale(ReduceOp op, int world);
// What every reduction kernel starts from: r's type, scale, count and
// output, the grid cap (fused_blocks where it meets its peers inside,
// SYMMPOOL_MAX_BLOCKS where barrier kernels bracket it); the algorithm
// fills in its inputs.
ReduceLaunch reduce_launch(AlgorithmContext& ctx, const Reduction& r, bool fused, int fused_blocks);
// Whether a reduction kernel reading this much from each peer meets its
// peers inside (fused_kernel_limit, or SYMMPOOL_FUSED_MAX_BYTES).
inline bool fused_reduction(const AlgorithmContext& ctx, std::size_t bytes_per_peer) {
  return bytes_per_peer <= ctx.tuning().fused_max_bytes;
}
// The chunk of an all-reduce's `count` elements this rank reduces.
ChunkOfRank chunk_of_rank(const AlgorithmContext& ctx, std::size_t count, std::size_t element_bytes);

}  // namespace symmpool::detail
