// The low-latency all-reduce's kernel (kernels.hpp says how the protocol
// works; low_latency.cpp enqueues it).

#include "device_common.cuh"
#include "kernels.hpp"

#include <symmpool/driver_api.hpp>
#include <symmpool/error.hpp>

#include <algorithm>

namespace symmpool::detail {

namespace {

constexpr int kThreads = 256;
// One unit a thread up to 128 KiB, the largest the table gives it.
constexpr int kMaxBlocks = 64;

// Volatile 16-byte accesses, as NCCL's LL protocol makes them: each 8-byte
// half {data, flag} is written and read whole.
__device__ __forceinline__ void store_packet(uint4* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

__device__ __forceinline__ uint4 load_packet(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// Unit u: the 8 bytes of elements [u * E, u * E + E), zeros past `count`.
template <typename T>
__device__ __forceinline__ uint2 load_unit(const T* in, std::size_t u, std::size_t count, bool aligned) {
  constexpr int E = 8 / sizeof(T);
  const std::size_t first = u * E;
  if (aligned && first + E <= count) return *reinterpret_cast<const uint2*>(in + first);
  uint2 raw = make_uint2(0, 0);
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int j = 0; j < E; ++j)
    if (first + j < count) e[j] = in[first + j];
  return raw;
}

template <typename T>
__device__ __forceinline__ void store_unit(T* out, std::size_t u, std::size_t count, bool aligned,
                                           uint2 raw) {
  constexpr int E = 8 / sizeof(T);
  const std::size_t first = u * E;
  if (aligned && first + E <= count) {
    *reinterpret_cast<uint2*>(out + first) = raw;
    return;
  }
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < E; ++j)
    if (first + j < count) out[first + j] = e[j];
}

// The block's last act: the last block to get here moves the epoch on and,
// for a call that ends at the end word, writes the call's number there.
// Every block's outputs are visible before the word: each block fences
// before it counts itself done, and the last one fences for the system
// before it writes.
__device__ void count_block_done(const LowLatencyLaunch& a, std::uint32_t epoch) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (a.end_word) __threadfence();
  if (atomicAdd(&a.epoch[1], 1u) == gridDim.x - 1) {
    a.epoch[1] = 0;
    a.epoch[0] = epoch;
    if (a.end_word) {
      __threadfence_system();
      *static_cast<volatile std::uint64_t*>(a.end_word) = a.call;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    low_latency_all_reduce_kernel(LowLatencyLaunch a, bool in_aligned, bool out_aligned) {
  constexpr int E = 8 / sizeof(T);
  // Every block reads the last call's epoch once (volatile: never again,
  // once the last block to arrive at the end has moved it on). 0 is what a
  // fresh region holds; skipping it by 2 keeps the parity alternating.
  std::uint32_t epoch = *static_cast<volatile std::uint32_t*>(a.epoch) + 1;
  // A failed rank sends no packets: a late peer must not sum them as if
  // this call had run here (it times out instead, naming this rank). Read
  // after the epoch, so that both loads are in flight together; once a
  // block, so that its threads agree. The block still counts itself done:
  // a call that ends at the end word must write it, or a stream waiting
  // for it would wait for good.
  __shared__ bool failed_before;
  if (threadIdx.x == 0) failed_before = has_failed(a.failure);
  __syncthreads();
  if (epoch == 0) epoch = 2;
  if (failed_before) {
    hold_until_acknowledged(a.failure);
    return count_block_done(a, epoch);
  }
  const std::size_t parity = epoch & 1u;
  const std::size_t units = (a.count * sizeof(T) + 7) / 8;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const auto* in = static_cast<const T*>(a.in);
  const std::size_t my_slot = (parity * a.world + a.rank) * a.slot_packets;

  // The last unit's second flag says where this rank's input ends (kernels.hpp).
  auto second_flag = [&](std::size_t u) { return u + 1 == units ? ~epoch : epoch; };
  for (std::size_t u = first; u < units; u += stride) {
    const uint2 w = load_unit(in, u, a.count, in_aligned);
    const uint4 packet = make_uint4(w.x, epoch, w.y, second_flag(u));
#pragma unroll
    for (int p = 0; p < kMaxRanks; ++p)
      if (p < a.world && p != a.rank)
        store_packet(static_cast<uint4*>(a.regions.ptr[p]) + my_slot + u, packet);
  }

  // Sums in rank order, as every symmpool reduction: the same bits on every rank.
  const auto* mine = static_cast<const uint4*>(pick(a.regions.ptr, a.rank));
  bool failed = false;  // a peer's packets never came: stop waiting, the communicator is failed
  for (std::size_t u = first; u < units; u += stride) {
    float acc[E] = {};
#pragma unroll
    for (int p = 0; p < kMaxRanks; ++p) {
      if (p >= a.world) continue;
      uint2 w;
      if (p == a.rank) {
        w = load_unit(in, u, a.count, in_aligned);
      } else {
        const uint4* slot = mine + (parity * a.world + p) * a.slot_packets + u;
        const std::uint32_t second = second_flag(u);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (!failed)
          failed = !wait_until(
              [&] {
                v = load_packet(slot);
                return v.y == epoch && v.w == second;
              },
              p, a.failure);
        w = make_uint2(v.x, v.z);
      }
      const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
      for (int j = 0; j < E; ++j) acc[j] += to_float(e[j]);
    }
    uint2 sums;
    T* s = reinterpret_cast<T*>(&sums);
#pragma unroll
    for (int j = 0; j < E; ++j) s[j] = from_float<T>(acc[j] * a.scale);
    store_unit(static_cast<T*>(a.out), u, a.count, out_aligned, sums);
  }

  // Epochs come round again after 2^32 calls, and a region keeps packets
  // beyond the sizes of later calls: the last call of each parity before
  // the wrap zeroes its whole region (every sender's slot, each thread its
  // own units), as NCCL cleans its LL buffers. No peer writes this parity
  // again before it has our packets of the next call, sent after this.
  if (epoch >= 0xFFFFFFFEu) {
    for (int p = 0; p < a.world; ++p) {
      if (p == a.rank) continue;
      uint4* slot =
          static_cast<uint4*>(pick(a.regions.ptr, a.rank)) + (parity * a.world + p) * a.slot_packets;
      for (std::size_t u = first; u < a.slot_packets; u += stride)
        store_packet(slot + u, make_uint4(0, 0, 0, 0));
    }
  }

  count_block_done(a, epoch);
}

bool aligned8(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 7) == 0; }

// Launched through the driver with a context-free kernel handle (found once
// per type): cudaLaunchKernelEx adds host time to every eager call over
// the cuLaunchKernelEx under it, and <<<>>> a cudaGetLastError besides
// (docs/DESIGN.md, "Life of one collective";
// bench/results/host_time_h200x2_2026-11-27_host-path-through-driver-ab.json).
// cuLaunchKernel returns the launch's error itself; a CUkernel runs in the
// context of the stream it is launched on (loaded there on first use, as
// <<<>>> does under lazy loading), so one handle serves every device.
template <typename T>
void low_latency_as(const LowLatencyLaunch& a, cudaStream_t stream) {
  static const CUfunction kernel = [] {
    cudaKernel_t handle = nullptr;
    SYMMPOOL_CUDA_TRY(cudaGetKernel(&handle, low_latency_all_reduce_kernel<T>));
    return reinterpret_cast<CUfunction>(handle);
  }();
  const std::size_t units = (a.count * sizeof(T) + 7) / 8;
  const auto blocks =
      static_cast<unsigned>(std::clamp<std::size_t>((units + kThreads - 1) / kThreads, 1, kMaxBlocks));
  bool in_aligned = aligned8(a.in), out_aligned = aligned8(a.out);
  void* params[] = {const_cast<LowLatencyLaunch*>(&a), &in_aligned, &out_aligned};
  SYMMPOOL_CU_TRY(real_driver(), cuLaunchKernel(kernel, blocks, 1, 1, kThreads, 1, 1, 0,
                                                reinterpret_cast<CUstream>(stream), params, nullptr));
}

}  // namespace

void launch_low_latency_all_reduce(const LowLatencyLaunch& launch, cudaStream_t stream) {
  switch (launch.type) {
    case DataType::kFloat32:
      return low_latency_as<float>(launch, stream);
    case DataType::kFloat16:
      return low_latency_as<__half>(launch, stream);
    case DataType::kBFloat16:
      return low_latency_as<__nv_bfloat16>(launch, stream);
  }
  SYMMPOOL_CUDA_TRY(cudaErrorInvalidValue);
}

// Every instantiation launch_low_latency_all_reduce may launch (kernels.hpp, load_*_kernels).
cudaError_t load_low_latency_kernels() {
  const void* kernels[] = {reinterpret_cast<const void*>(low_latency_all_reduce_kernel<float>),
                           reinterpret_cast<const void*>(low_latency_all_reduce_kernel<__half>),
                           reinterpret_cast<const void*>(low_latency_all_reduce_kernel<__nv_bfloat16>)};
  return load_kernels(kernels, sizeof kernels / sizeof kernels[0]);
}

}  // namespace symmpool::detail
