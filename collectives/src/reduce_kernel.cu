// The reduce kernel of the one-shot and two-shot reductions: every rank's
// part summed in fp32 from 16-byte loads of every peer, scaled, written to
// one or more outputs; small calls meet the peers inside (BlockMeeting).

#include "kernels.hpp"
#include "launch_shape.cuh"
#include "meeting_protocol.cuh"

#include <algorithm>
#include <type_traits>

namespace symmpool::detail {

namespace {

// The reduce kernel's scalars. Its pointer arrays and BlockSync stay
// parameters of their own: with all of ReduceLaunch as one parameter, the
// kernel reached them through the parameter's address and compiled to other
// machine code (sm_90, nvdisasm); this way it is the same as with one
// parameter per field.
struct ReduceScalars {
  std::size_t src_offset;
  std::size_t dst_offset;
  std::size_t count;
  int n_outs;
  int world;
  float scale;
};

// Sums one 16-byte vector of every rank in fp32 and scales it.
template <typename T, int kRanksCap>
__device__ __forceinline__ uint4 reduce_vector(const uint4 (&raw)[kRanksCap], int world, float scale) {
  constexpr int V = 16 / sizeof(T);
  float acc[V] = {};
#pragma unroll
  for (int p = 0; p < kRanksCap; ++p) {
    if (p < world) {
      const T* e = reinterpret_cast<const T*>(&raw[p]);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += to_float(e[j]);
    }
  }
  uint4 packed;
  T* sums = reinterpret_cast<T*>(&packed);
#pragma unroll
  for (int j = 0; j < V; ++j) sums[j] = from_float<T>(acc[j] * scale);
  return packed;
}

// kRanksCap >= world: the smallest of 2, 4, kMaxRanks (reduce_as picks it).
template <typename T, int kRanksCap>
__global__ void __launch_bounds__(kThreads)
    reduce_kernel(BlockSync sync, PeerPointers in, OutPointers out, ReduceScalars r, bool vectorized) {
  BlockMeeting meeting{sync, r.world};
  if (!meeting.start()) return;
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte load
  constexpr int U = kVectorsPerThread<kRanksCap>;
  // A grid-stride loop taking U strides at a time: each load instruction
  // stays coalesced across the warp, and a grid that covers the message
  // (small calls) gives each thread one vector, as a plain loop would.
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t vectors = vectorized ? r.count / V : 0;
  for (std::size_t base = first; base < vectors; base += stride * U) {
    uint4 raw[U][kRanksCap];
#pragma unroll
    for (int u = 0; u < U; ++u) {  // every load in flight before the first add
      const std::size_t v = base + u * stride;
#pragma unroll
      for (int p = 0; p < kRanksCap; ++p)
        if (p < r.world && v < vectors)
          raw[u][p] =
              __ldcg(reinterpret_cast<const uint4*>(static_cast<const T*>(in.ptr[p]) + r.src_offset) + v);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::size_t v = base + u * stride;
      if (v >= vectors) break;
      const uint4 packed = reduce_vector<T, kRanksCap>(raw[u], r.world, r.scale);
#pragma unroll
      for (int o = 0; o < kRanksCap; ++o)
        if (o < r.n_outs) reinterpret_cast<uint4*>(static_cast<T*>(out.ptr[o]) + r.dst_offset)[v] = packed;
    }
  }
  for (std::size_t i = vectors * V + first; i < r.count; i += stride) {
    float acc = 0.f;
#pragma unroll
    for (int p = 0; p < kRanksCap; ++p)
      if (p < r.world) acc += to_float(__ldcg(static_cast<const T*>(in.ptr[p]) + r.src_offset + i));
    const T value = from_float<T>(acc * r.scale);
#pragma unroll
    for (int o = 0; o < kRanksCap; ++o)
      if (o < r.n_outs) static_cast<T*>(out.ptr[o])[r.dst_offset + i] = value;
  }
  meeting.end();
}

template <typename T, int kRanksCap>
cudaError_t reduce_as(const ReduceLaunch& r, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  // Alignment may differ across ranks (reduce-scatter reads at rank * count),
  // so it picks the loads but never the grid: meeting blocks must match.
  bool vectorized = true;
  for (int p = 0; p < r.world; ++p)
    vectorized = vectorized && aligned16(static_cast<const T*>(r.in.ptr[p]) + r.src_offset);
  for (int o = 0; o < r.n_outs; ++o)
    vectorized = vectorized && aligned16(static_cast<T*>(r.out.ptr[o]) + r.dst_offset);
  // Meeting blocks each have their own row of signal pads.
  if (r.max_blocks < 1 || (r.sync.enabled && r.max_blocks > kMaxSyncBlocks)) return cudaErrorInvalidValue;
  const int blocks = grid_for(r.grid_count / V + 1, static_cast<std::size_t>(r.max_blocks));
  const ReduceScalars scalars{r.src_offset, r.dst_offset, r.count, r.n_outs, r.world, r.scale};
  reduce_kernel<T, kRanksCap><<<blocks, kThreads, 0, stream>>>(r.sync, r.in, r.out, scalars, vectorized);
  return cudaGetLastError();
}

template <typename T>
cudaError_t reduce_as(const ReduceLaunch& r, cudaStream_t stream) {
  return with_ranks_cap(std::max(r.world, r.n_outs),
                        [&](auto cap) { return reduce_as<T, decltype(cap)::value>(r, stream); });
}

}  // namespace

cudaError_t launch_reduce(const ReduceLaunch& launch, cudaStream_t stream) {
  switch (launch.type) {
    case DataType::kFloat32:
      return reduce_as<float>(launch, stream);
    case DataType::kFloat16:
      return reduce_as<__half>(launch, stream);
    case DataType::kBFloat16:
      return reduce_as<__nv_bfloat16>(launch, stream);
  }
  return cudaErrorInvalidValue;
}

// Every instantiation launch_reduce may launch (kernels.hpp, load_*_kernels).
cudaError_t load_reduce_kernels() {
  const void* kernels[] = {reinterpret_cast<const void*>(reduce_kernel<float, 2>),
                           reinterpret_cast<const void*>(reduce_kernel<float, 4>),
                           reinterpret_cast<const void*>(reduce_kernel<float, kMaxRanks>),
                           reinterpret_cast<const void*>(reduce_kernel<__half, 2>),
                           reinterpret_cast<const void*>(reduce_kernel<__half, 4>),
                           reinterpret_cast<const void*>(reduce_kernel<__half, kMaxRanks>),
                           reinterpret_cast<const void*>(reduce_kernel<__nv_bfloat16, 2>),
                           reinterpret_cast<const void*>(reduce_kernel<__nv_bfloat16, 4>),
                           reinterpret_cast<const void*>(reduce_kernel<__nv_bfloat16, kMaxRanks>)};
  return load_kernels(kernels, sizeof kernels / sizeof kernels[0]);
}

}  // namespace symmpool::detail
