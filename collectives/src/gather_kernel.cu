// The all-gather kernel for small messages: every peer's input read with
// 16-byte loads into this rank's output, meeting the peers inside.

#include "kernels.hpp"
#include "launch_shape.cuh"
#include "meeting_protocol.cuh"

#include <cstddef>

namespace symmpool::detail {

namespace {

// As the reduce kernel: kLoadsInFlight loads a thread, a grid-stride loop
// taking U strides at a time (kRanksCap >= world, picked by the launcher).
// Staging: each thread copies the very elements it reads from every rank
// below, so block b's part of this rank's input is in place when block b of
// each peer meets it; the fence makes the block's copies visible to the
// peers before the meeting's signal.
__device__ __forceinline__ void stage_own_input(const Staging& staging, std::size_t bytes, std::size_t first,
                                                std::size_t stride, std::size_t vectors, int world) {
  for (std::size_t v = first; v < vectors; v += stride)
    reinterpret_cast<uint4*>(staging.to)[v] = __ldcg(reinterpret_cast<const uint4*>(staging.from) + v);
  for (std::size_t i = vectors * 16 + first; i < bytes; i += stride) staging.to[i] = staging.from[i];
  __syncthreads();
  if (threadIdx.x < world) __threadfence_system();
}

template <int kRanksCap>
__global__ void __launch_bounds__(kThreads)
    gather_copy_kernel(BlockSync sync, PeerPointers src, char* dst, std::size_t bytes, int world,
                       bool vectorized, Staging staging) {
  constexpr int U = kVectorsPerThread<kRanksCap>;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t vectors = vectorized ? bytes / 16 : 0;
  if (staging.from != nullptr) stage_own_input(staging, bytes, first, stride, vectors, world);
  BlockMeeting meeting{sync, world};
  if (!meeting.start()) return;
  for (std::size_t base = first; base < vectors; base += stride * U) {
    uint4 raw[U][kRanksCap];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::size_t v = base + u * stride;
#pragma unroll
      for (int p = 0; p < kRanksCap; ++p)
        if (p < world && v < vectors) raw[u][p] = __ldcg(static_cast<const uint4*>(src.ptr[p]) + v);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::size_t v = base + u * stride;
      if (v >= vectors) break;
#pragma unroll
      for (int p = 0; p < kRanksCap; ++p)
        if (p < world) reinterpret_cast<uint4*>(dst + p * bytes)[v] = raw[u][p];
    }
  }
  for (std::size_t i = vectors * 16 + first; i < bytes; i += stride) {
#pragma unroll
    for (int p = 0; p < kRanksCap; ++p)
      if (p < world) dst[p * bytes + i] = static_cast<const char*>(src.ptr[p])[i];
  }
  meeting.end();
}

}  // namespace

cudaError_t launch_gather_copy(const BlockSync& sync, const PeerPointers& src, char* dst, std::size_t bytes,
                               int world, cudaStream_t stream, Staging staging) {
  // Staging needs the meeting inside: barriers around the kernel would let
  // the peers read before it.
  if (staging.from != nullptr && !sync.enabled) return cudaErrorInvalidValue;
  bool vectorized = aligned16(dst) && bytes % 16 == 0 && (staging.from == nullptr || aligned16(staging.from));
  for (int p = 0; p < world; ++p) vectorized = vectorized && aligned16(src.ptr[p]);
  // 32 blocks at most, as measured (peers_h200x2_2026-11-27_gather-unroll-and-fused-4m.json);
  // 64, the reductions' meeting grid, is not measured for it.
  constexpr std::size_t kGatherBlocks = 32;
  static_assert(kGatherBlocks <= kMaxSyncBlocks, "a block meets its peers on its own row");
  const int blocks = grid_for(bytes / 16 + 1, kGatherBlocks);  // equal on every rank
  return with_ranks_cap(world, [&](auto cap) {
    gather_copy_kernel<decltype(cap)::value>
        <<<blocks, kThreads, 0, stream>>>(sync, src, dst, bytes, world, vectorized, staging);
    return cudaGetLastError();
  });
}

// Every instantiation launch_gather_copy may launch (kernels.hpp, load_*_kernels).
cudaError_t load_gather_kernels() {
  const void* kernels[] = {reinterpret_cast<const void*>(gather_copy_kernel<2>),
                           reinterpret_cast<const void*>(gather_copy_kernel<4>),
                           reinterpret_cast<const void*>(gather_copy_kernel<kMaxRanks>)};
  return load_kernels(kernels, sizeof kernels / sizeof kernels[0]);
}

}  // namespace symmpool::detail
