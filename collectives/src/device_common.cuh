#pragma once
// Device code the collectives' kernels share: picking a peer's pointer,
// waits on peers that give up after a timeout, and the element types'
// conversions to the fp32 that reductions accumulate in.

#include "error_words.hpp"

#include <symmpool/detail/peer_pointers.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cuda/atomic>

namespace symmpool::detail {

// Peer pointers are indexed with compile-time constants only (loops over
// kMaxRanks, unrolled), so they stay in the parameter bank: a runtime index
// made the compiler copy the whole array to the local stack.
template <typename Array>
__device__ __forceinline__ auto pick(const Array& a, int p) {
  auto r = a[0];
#pragma unroll
  for (int i = 1; i < kMaxRanks; ++i)
    if (i == p) r = a[i];
  return r;
}

using SystemWord = cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>;

// Cycles a wait spins before it also reads the error flag (host memory, so
// never on the fast path): about 1 ms.
constexpr long long kFlagLookCycles = 2'000'000;

// FailureWords' error_flag points at ErrorWords' `missing`, the kernels' way in to all three.
static_assert(sizeof(ErrorWords) == 3 * sizeof(int) && alignof(ErrorWords) == alignof(int),
              "error_flag[1] is `acknowledged`, error_flag[2] `differing`");

// This rank's communicator has failed, as far as its kernels know (a wait
// gave up, calls differed): read first by every kernel that touches peers.
__device__ __forceinline__ bool has_failed(const FailureWords& f) {
  return *static_cast<const volatile std::uint32_t*>(f.failed) != 0;
}

// Sticky: the word is never cleared (a new communicator gets a new one).
__device__ __forceinline__ void mark_failed(const FailureWords& f) {
  *static_cast<volatile std::uint32_t*>(f.failed) = 1;
}

// Holds the stream until the host has the failure on record (and has
// aborted, where asked): nothing after this collective may run as if it had
// succeeded. Bounded, in case the host never looks. A kernel that finds
// its communicator failed when it starts holds too (at once where the
// failure is on record already): on a stream not ordered after the failed
// call, its Work could otherwise end as a success before the host knows.
__device__ __forceinline__ void hold_until_acknowledged(const FailureWords& f) {
  const long long gave_up = clock64();
  while (*static_cast<volatile int*>(f.error_flag + 1) == 0 && clock64() - gave_up < f.timeout_cycles) {
  }
}

// `peer`'s call, whose digest is `theirs`, differs from ours: the
// communicator fails, naming it (and saying whether it had failed itself).
__device__ __forceinline__ void report_differing(int peer, std::uint32_t theirs, const FailureWords& f) {
  mark_failed(f);
  const int differing = peer + 1 + (theirs == kFailedRankDigest ? kPeerHadFailed : 0);
  atomicCAS(f.error_flag + 2, 0, differing);  // before the code that sends the host to read it
  __threadfence_system();
  atomicCAS(f.error_flag, 0, kCallsDiffer);
  hold_until_acknowledged(f);
}

struct NothingToSay {
  __device__ void operator()() const {}
};

// Spins until `arrived()` holds. Gives up after the timeout, or as soon as
// another wait of this communicator gave up (the failed word or the host's
// flag is set): collectives queued behind a failed one then drain instead
// of each waiting out its own timeout. A wait that gives up marks the
// communicator failed and calls `give_up()` first (before it holds the
// stream). Returns whether it arrived.
template <typename Arrived, typename GiveUp = NothingToSay>
__device__ __forceinline__ bool wait_until(Arrived arrived, int peer, const FailureWords& f,
                                           GiveUp give_up = {}) {
  const long long start = clock64();
  long long next_look = start + kFlagLookCycles;
  while (!arrived()) {
    const long long now = clock64();
    if (now - start > f.timeout_cycles) {
      mark_failed(f);
      give_up();
      atomicCAS(f.error_flag, 0, peer + 1);
      hold_until_acknowledged(f);
      return false;
    }
    if (now > next_look) {
      if (has_failed(f) || *static_cast<volatile int*>(f.error_flag) != 0) {
        mark_failed(f);
        give_up();
        hold_until_acknowledged(f);  // on record before this stream goes on
        return false;
      }
      next_look = now + kFlagLookCycles;
    }
  }
  return true;
}

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float v) {
  return __float2bfloat16_rn(v);
}

}  // namespace symmpool::detail
