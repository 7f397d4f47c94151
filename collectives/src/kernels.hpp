#pragma once
// Launchers of the collectives' device code (kernels.cu). Kernels given an
// enabled BlockSync meet their peers block by block at their start (inputs
// ready everywhere) and at their end (nobody reads or writes a peer any
// more); otherwise the caller brackets them with launch_barrier.

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

// For i < count and o < n_outs:
//   out_o[dst_offset + i] = scale * sum_p in_p[src_offset + i], in fp32.
// grid_count sizes the grid: with sync enabled it must be equal on every
// rank, so two-shot passes its full chunk even where the last one is short.
// Without sync, the grid has at most max_blocks blocks.
cudaError_t launch_reduce(const BlockSync& sync, const PeerPointers& in, std::size_t src_offset,
                          const OutPointers& out, int n_outs, std::size_t dst_offset,
                          std::size_t count, std::size_t grid_count, int world, DataType type,
                          float scale, int max_blocks, cudaStream_t stream);

// dst[p * bytes, (p + 1) * bytes) = src_p[0, bytes) for every p < world.
cudaError_t launch_gather_copy(const BlockSync& sync, const PeerPointers& src, char* dst,
                               std::size_t bytes, int world, cudaStream_t stream);

}  // namespace symmpool::detail
