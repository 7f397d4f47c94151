#pragma once
// One reduce_scatter or all_reduce as its algorithms (one_shot.cpp,
// two_shot.cpp, two_step.cpp) see it.

#include <symmpool/collective_types.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/detail/peer_pointers.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>

namespace symmpool {

struct Communicator::Reduction {
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
struct Communicator::ChunkOfRank {
  std::size_t first;   // elements before it
  std::size_t count;   // its elements: the last ranks' may be short or empty
  std::size_t stride;  // elements of a full chunk, equal on every rank
};

// What two_step() moves and reduces: this rank's chunk, as every rank's
// buffers hold it.
struct Communicator::TwoStepChunk {
  detail::PeerPointers sources{};  // rank p's copy of the chunk's input, as mapped here (ours: local)
  void* result = nullptr;          // where the reduced chunk lands here
  detail::OutPointers pushes{};    // all_reduce: where it lands in every rank's output
  bool push = false;
  std::size_t count = 0;  // elements
};

}  // namespace symmpool
