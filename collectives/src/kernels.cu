#include "kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace symmpool::detail {

namespace {

__global__ void barrier_kernel(PadPointers peers, std::uint32_t* my_pads,
                               std::uint32_t* epoch_counter, int rank, int world, int* error_flag,
                               long long timeout_cycles) {
  __shared__ std::uint32_t epoch;
  const int t = threadIdx.x;
  if (t == 0) epoch = *epoch_counter + 1;
  __syncthreads();
  if (t < world) {
    __threadfence_system();  // what this stream wrote before is visible first
    *reinterpret_cast<volatile std::uint32_t*>(peers.peer[t] + rank) = epoch;
    volatile std::uint32_t* mine = my_pads + t;
    const long long start = clock64();
    while (static_cast<int>(*mine - epoch) < 0) {
      if (clock64() - start > timeout_cycles) {
        atomicCAS(error_flag, 0, t + 1);
        break;
      }
    }
    __threadfence_system();  // and what peers wrote before signalling is visible after
  }
  __syncthreads();
  if (t == 0) *epoch_counter = epoch;
}

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float(float v) { return v; }
template <> __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float(float v) { return v; }
template <> __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__global__ void reduce_kernel(PeerPointers in, T* out, std::size_t count, std::size_t src_offset,
                              int world, float scale, bool vectorized) {
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte load
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t vectors = vectorized ? count / V : 0;
  for (std::size_t v = first; v < vectors; v += stride) {
    float acc[V] = {};
    for (int p = 0; p < world; ++p) {
      const uint4 raw = reinterpret_cast<const uint4*>(static_cast<const T*>(in.ptr[p]) + src_offset)[v];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += to_float(e[j]);
    }
    uint4 packed;
    T* r = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int j = 0; j < V; ++j) r[j] = from_float<T>(acc[j] * scale);
    reinterpret_cast<uint4*>(out)[v] = packed;
  }
  for (std::size_t i = vectors * V + first; i < count; i += stride) {
    float acc = 0.f;
    for (int p = 0; p < world; ++p) acc += to_float(static_cast<const T*>(in.ptr[p])[src_offset + i]);
    out[i] = from_float<T>(acc * scale);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0; }

template <typename T>
cudaError_t reduce_as(const PeerPointers& in, void* out, std::size_t count, std::size_t src_offset,
                      int world, float scale, cudaStream_t stream) {
  bool vectorized = aligned16(out);
  for (int p = 0; p < world; ++p)
    vectorized = vectorized && aligned16(static_cast<const T*>(in.ptr[p]) + src_offset);
  constexpr int threads = 256;
  const std::size_t work = vectorized ? count / (16 / sizeof(T)) + 1 : count;
  const int blocks = static_cast<int>(std::min<std::size_t>((work + threads - 1) / threads, 132 * 8));
  reduce_kernel<T><<<blocks > 0 ? blocks : 1, threads, 0, stream>>>(
      in, static_cast<T*>(out), count, src_offset, world, scale, vectorized);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_barrier(const PadPointers& peers, std::uint32_t* my_pads,
                           std::uint32_t* epoch_counter, int rank, int world, int* error_flag,
                           long long timeout_cycles, cudaStream_t stream) {
  barrier_kernel<<<1, 32, 0, stream>>>(peers, my_pads, epoch_counter, rank, world, error_flag,
                                       timeout_cycles);
  return cudaGetLastError();
}

cudaError_t launch_reduce(const PeerPointers& in, void* out, std::size_t count,
                          std::size_t src_offset, int world, DataType type, float scale,
                          cudaStream_t stream) {
  switch (type) {
    case DataType::kFloat32: return reduce_as<float>(in, out, count, src_offset, world, scale, stream);
    case DataType::kFloat16: return reduce_as<__half>(in, out, count, src_offset, world, scale, stream);
    case DataType::kBFloat16:
      return reduce_as<__nv_bfloat16>(in, out, count, src_offset, world, scale, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace symmpool::detail
