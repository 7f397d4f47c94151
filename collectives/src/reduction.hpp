#pragma once
// One reduce_scatter or all_reduce as its algorithms (one_shot.cpp,
// two_shot.cpp, two_step.cpp) see it.

#include <symmpool/collective_types.hpp>
#include <symmpool/communicator.hpp>

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

}  // namespace symmpool
