#pragma once
// Launchers of the collectives' device code (kernels.cu).

#include <symmpool/collective_types.hpp>
#include <symmpool/detail/peer_pointers.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace symmpool::detail {

// Signals every peer, then waits until every peer signalled this epoch; a
// wait longer than timeout_cycles sets *error_flag to 1 + the missing rank.
cudaError_t launch_barrier(const PadPointers& peers, std::uint32_t* my_pads,
                           std::uint32_t* epoch_counter, int rank, int world, int* error_flag,
                           long long timeout_cycles, cudaStream_t stream);

// out[i] = scale * sum_p in_p[src_offset + i], accumulated in fp32.
cudaError_t launch_reduce(const PeerPointers& in, void* out, std::size_t count,
                          std::size_t src_offset, int world, DataType type, float scale,
                          cudaStream_t stream);

}  // namespace symmpool::detail
