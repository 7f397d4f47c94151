#include "device_common.cuh"
#include "kernels.hpp"

#include <algorithm>
#include <type_traits>

namespace symmpool::detail {

namespace {

constexpr int kThreads = 512;

// Memory orders follow PyTorch's symmetric-memory kernels: a signal is a
// release only where this kernel wrote data a peer reads after it, and a
// wait an acquire only where this kernel reads peers' data after it; what
// earlier kernels and copies wrote is ordered by the stream itself.
__device__ __forceinline__ void signal(std::uint32_t* pad, std::uint32_t epoch,
                                       cuda::std::memory_order order) {
  SystemWord(*pad).store(epoch, order);
}

// Waits until `pad` reaches `epoch` (wrap-safe), or gives up (wait_until).
template <typename GiveUp = NothingToSay>
__device__ __forceinline__ bool wait_for(std::uint32_t* pad, std::uint32_t epoch,
                                         cuda::std::memory_order order, int peer, const FailureWords& f,
                                         GiveUp give_up = {}) {
  SystemWord word(*pad);
  return wait_until([&] { return static_cast<int>(word.load(order) - epoch) >= 0; }, peer, f, give_up);
}

// Where rank `from`'s call digest lies in a rank's `pads` (as mapped here).
__device__ __forceinline__ std::uint32_t& call_slot(std::uint32_t* pads, int from) {
  return pads[kCallRow * kMaxRanks + from];
}

// A rank's block start words in its `pads`: [kMaxSyncBlocks][kMaxRanks],
// each the meeting's value (high half) and a digest (low half).
__device__ __forceinline__ std::uint64_t* start_words(std::uint32_t* pads) {
  return reinterpret_cast<std::uint64_t*>(reinterpret_cast<char*>(pads) + kStartWordsOffset);
}

using CallWord = cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>;

// Rank `from`'s call word in a rank's `pads` (peer_pointers.hpp).
__device__ __forceinline__ std::uint64_t& call_word(std::uint32_t* pads, int from) {
  return reinterpret_cast<std::uint64_t*>(reinterpret_cast<char*>(pads) + kCallWordsOffset)[from];
}

// At a call's first meeting: this call's number and digest into rank t's call word.
__device__ __forceinline__ void announce_call(const PeerSignals& s, int t, std::uint32_t call) {
  CallWord(call_word(pick(s.peers.peer, t), s.rank))
      .store((std::uint64_t{s.call_number} << 32) | call, cuda::std::memory_order_relaxed);
}

// Rank t's digest where its call word says it is at this call with another
// digest (at another call, maybe meeting elsewhere: it will not signal this
// wait), else 0. A word from rank t's earlier call carries another number;
// 0 as digest is a word never written.
__device__ __forceinline__ std::uint32_t digest_of_other_call(const PeerSignals& s, int t,
                                                              std::uint32_t call) {
  const std::uint64_t word = CallWord(call_word(s.my_pads, t)).load(cuda::std::memory_order_relaxed);
  const auto digest = static_cast<std::uint32_t>(word);
  const bool this_call = static_cast<std::uint32_t>(word >> 32) == s.call_number;
  return this_call && digest != 0 && digest != call ? digest : 0;
}

// Rank t's digest of its current call, as it wrote it into our call row.
__device__ __forceinline__ std::uint32_t digest_of_peer(const PeerSignals& s, int t) {
  return SystemWord(call_slot(s.my_pads, t)).load(cuda::std::memory_order_relaxed);
}

// Our failed-rank mark in rank t's call row: rank t, waiting for us at a
// meeting we will not signal, fails there (it looks every kMarkLookSpins).
__device__ __forceinline__ void mark_us_failed_for(const PeerSignals& s, int t) {
  SystemWord(call_slot(pick(s.peers.peer, t), s.rank))
      .store(kFailedRankDigest, cuda::std::memory_order_relaxed);
}

// A wait for rank t gave up, and this rank's kernels will drain, signalling
// as they go: a rank t that comes later must not take those signals for its
// call's. kFailedRankDigest over our digests in rank t's start words (their
// low halves: the values stay) and our failed-rank mark in every peer's call
// row (rank t's included) fail their next check or wait, naming us; our later
// first meetings write the mark again (the failed word), never a digest. All
// made visible at once, before the wait holds the stream, so that peers learn
// it even where the process then aborts. Not where digests differ: each peer
// sees that itself, and would read our mark instead, naming the wrong cause.
__device__ __forceinline__ void give_up_on(const PeerSignals& s, int t, int world) {
  std::uint32_t* theirs = pick(s.peers.peer, t);
  for (int b = 0; b < kMaxSyncBlocks; ++b) {  // a start word's digest is its first 32-bit word
    auto* digest = reinterpret_cast<std::uint32_t*>(start_words(theirs) + b * kMaxRanks + s.rank);
    SystemWord(*digest).store(kFailedRankDigest, cuda::std::memory_order_relaxed);
  }
  for (int p = 0; p < world; ++p)
    if (p != s.rank) mark_us_failed_for(s, p);
  __threadfence_system();
}

// Spins of a meeting's wait between looks at the peer's call slot (about a
// millisecond): off the fast path, which reads the signal only.
constexpr unsigned kMarkLookSpins = 1024;

// Thread t < world signals rank t on `row` and waits for rank t's signal.
// With a call digest (a call's first meeting, call_check.hpp) it first
// writes ours into rank t's call row and, once rank t's signal came,
// compares rank t's with ours. Returns false where they differ (the
// communicator then fails, naming rank t), where the wait gave up, where
// rank t's mark says it had failed (seen while waiting), or where this
// rank had failed before: the caller read the failed word, and this rank
// then writes the failed-rank mark into rank t's call row and neither
// signals nor waits. A failed rank's signal could be taken for one of an
// earlier meeting (a wait accepts any later epoch), so it sends none: rank
// t finds the mark while it waits, or at its first meeting's check where
// our signal came before we failed. The caller must not touch peers.
__device__ __forceinline__ bool signal_and_wait(const PeerSignals& s, int world, int row, std::uint32_t epoch,
                                                cuda::std::memory_order signal_order,
                                                cuda::std::memory_order wait_order, std::uint32_t call,
                                                bool failed_before) {
  const int t = threadIdx.x;
  if (t >= world) return true;
  if (failed_before) {
    mark_us_failed_for(s, t);
    hold_until_acknowledged(s.failure);
    return false;
  }
  if (call != 0) {
    SystemWord(call_slot(pick(s.peers.peer, t), s.rank)).store(call, cuda::std::memory_order_relaxed);
    announce_call(s, t, call);
    signal_order = cuda::std::memory_order_release;  // our digest lands before our signal
    wait_order = cuda::std::memory_order_acquire;    // theirs is read after theirs
  }
  signal(pick(s.peers.peer, t) + row * kMaxRanks + s.rank, epoch, signal_order);
  SystemWord word(s.my_pads[row * kMaxRanks + t]);
  unsigned spins = 0;
  bool peer_failed = false;
  std::uint32_t other_call = 0;
  const bool arrived = wait_until(
      [&] {
        if (static_cast<int>(word.load(wait_order) - epoch) >= 0) return true;
        if (++spins % kMarkLookSpins != 0) return false;
        if (call != 0 && (other_call = digest_of_other_call(s, t, call)) != 0) return true;
        return peer_failed = digest_of_peer(s, t) == kFailedRankDigest;
      },
      t, s.failure, [&] { give_up_on(s, t, world); });
  if (!arrived) return false;  // a wait that gave up has set the flags already
  if (peer_failed || other_call != 0) {
    report_differing(t, peer_failed ? kFailedRankDigest : other_call, s.failure);
    return false;
  }
  if (call == 0) return true;
  const std::uint32_t theirs = digest_of_peer(s, t);
  if (theirs == call) return true;
  report_differing(t, theirs, s.failure);
  return false;
}

// A block meeting's start: thread t < world writes `value` and our call
// digest into rank t's start word for this block, in one 64-bit store, and
// waits for rank t's; then compares rank t's digest with ours (where
// `call` is nonzero). Rank t cannot write this word again before its next
// call, which waits for this block's end meeting: what is read after the
// wait is rank t's digest for this call. Returns false where they differ,
// where the wait gave up, or where this rank had failed before (as
// signal_and_wait): the kernel must then leave peers alone.
__device__ __forceinline__ bool start_meeting(const PeerSignals& s, int world, std::uint32_t value,
                                              std::uint32_t call) {
  using StartWord = cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>;
  const int t = threadIdx.x;
  if (t >= world) return true;
  const int slot = static_cast<int>(blockIdx.x) * kMaxRanks;
  const bool failed_before = has_failed(s.failure);
  const std::uint32_t ours = failed_before ? kFailedRankDigest : call;
  if (call != 0 && !failed_before) announce_call(s, t, call);
  StartWord(start_words(pick(s.peers.peer, t))[slot + s.rank])
      .store((std::uint64_t{value} << 32) | ours, cuda::std::memory_order_relaxed);
  if (failed_before) {
    hold_until_acknowledged(s.failure);
    return false;
  }
  StartWord word(start_words(s.my_pads)[slot + t]);
  std::uint64_t seen = 0;
  unsigned spins = 0;
  std::uint32_t other_call = 0;  // rank t's digest, at this call number: it meets elsewhere
  const bool arrived = wait_until(
      [&] {
        seen = word.load(cuda::std::memory_order_acquire);
        if (static_cast<int>(static_cast<std::uint32_t>(seen >> 32) - value) >= 0) return true;
        if (call == 0 || ++spins % kMarkLookSpins != 0) return false;
        return (other_call = digest_of_other_call(s, t, call)) != 0;
      },
      t, s.failure, [&] { give_up_on(s, t, world); });
  if (!arrived) return false;
  if (other_call != 0) {
    report_differing(t, other_call, s.failure);
    return false;
  }
  const auto digest = static_cast<std::uint32_t>(seen);
  if (digest != kFailedRankDigest && (call == 0 || digest == call)) return true;
  report_differing(t, digest, s.failure);  // kFailedRankDigest: even where no digest is compared
  return false;
}

// Between copies or kernels of one collective: what came before on every
// rank is visible to what comes after on every rank. At a call's first
// meeting (signals.call) it also checks that every rank is at the same call
// with the same buffers. Where it fails, the kernels after it see the
// failed word and leave peers alone; copies after it run all the same, on a
// communicator that has failed.
__global__ void barrier_kernel(PeerSignals signals, int world, std::uint32_t* epoch_counter) {
  const std::uint32_t epoch = *epoch_counter + 1;
  const bool failed_before = has_failed(signals.failure);  // read beside the counter, not after it
  __syncwarp();  // every lane read the counter before lane 0 moves it on
  signal_and_wait(signals, world, kKernelBarrierRow, epoch, cuda::std::memory_order_release,
                  cuda::std::memory_order_acquire, signals.call, failed_before);
  if (threadIdx.x == 0) *epoch_counter = epoch;
}

__global__ void signal_kernel(PeerSignals signals, int peer, std::uint32_t* sent) {
  const std::uint32_t count = sent[peer] + 1;
  sent[peer] = count;
  signal(pick(signals.peers.peer, peer) + kSignalRow * kMaxRanks + signals.rank, count,
         cuda::std::memory_order_release);
}

__global__ void wait_kernel(PeerSignals signals, int peer, std::uint32_t* received) {
  const std::uint32_t count = received[peer] + 1;
  wait_for(signals.my_pads + kSignalRow * kMaxRanks + peer, count, cuda::std::memory_order_acquire, peer,
           signals.failure);
  received[peer] = count;
}

// Start and end meetings of a block-synchronised kernel: each block uses
// its own start words, pad row and epoch, so blocks never wait for each
// other. Only threads below `world` take part; each keeps the block's epoch
// itself.
struct BlockMeeting {
  const BlockSync& sync;
  int world;
  std::uint32_t epoch = 0;

  // Inputs are ready everywhere: later reads of peers see them. False
  // where a peer is at another call or passed other buffers, or the
  // communicator has failed (the kernel must then leave peers alone and
  // end). Without sync, the barrier before the kernel met the peers: only
  // the failed word is read.
  __device__ __forceinline__ bool start() {
    if (!sync.enabled) {
      if (!has_failed(sync.signals.failure)) return true;
      hold_until_acknowledged(sync.signals.failure);
      return false;
    }
    bool same_call = true;
    if (threadIdx.x < world) {
      epoch = sync.block_epochs[blockIdx.x];
      same_call = start_meeting(sync.signals, world, epoch + 1, sync.signals.call);
    }
    if (__syncthreads_and(same_call) != 0) return true;
    // This block skips its end meeting: peers that met it at the start
    // find the mark there instead of waiting out the timeout.
    if (threadIdx.x < world) mark_us_failed_for(sync.signals, threadIdx.x);
    return false;
  }
  // Every peer is done with this rank's buffers, and this block's writes
  // to peers are visible to them.
  __device__ __forceinline__ void end() {
    if (!sync.enabled) return;
    __syncthreads();
    if (threadIdx.x < world) {
      // A failure since the start is seen by the wait (it looks at the failed word).
      signal_and_wait(sync.signals, world, kFirstBlockRow + static_cast<int>(blockIdx.x), epoch + 2,
                      cuda::std::memory_order_release, cuda::std::memory_order_relaxed, /*call=*/0,
                      /*failed_before=*/false);
      if (threadIdx.x == 0) sync.block_epochs[blockIdx.x] = epoch + 2;
    }
  }
};

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

// Loads a thread keeps in flight in the reduce kernel's main loop: at
// kRanksCap ranks it takes kLoadsInFlight / kRanksCap vectors at a time.
// Peer loads are latency-bound: with one vector per thread, 64 blocks keep
// 512 KiB of peer reads in flight, too little to hide NVLink's latency; a
// large reduce-scatter ran well below the bare peer copy (docs/results.md,
// bench/results/peers_h200x2_2026-11-26_unrolled-reduce.json).
constexpr int kLoadsInFlight = 8;

template <int kRanksCap>
constexpr int kVectorsPerThread = kRanksCap >= kLoadsInFlight ? 1 : kLoadsInFlight / kRanksCap;

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

// As the reduce kernel: kLoadsInFlight loads a thread, a grid-stride loop
// taking U strides at a time (kRanksCap >= world, picked by the launcher).
template <int kRanksCap>
__global__ void __launch_bounds__(kThreads)
    gather_copy_kernel(BlockSync sync, PeerPointers src, char* dst, std::size_t bytes, int world,
                       bool vectorized) {
  BlockMeeting meeting{sync, world};
  if (!meeting.start()) return;
  constexpr int U = kVectorsPerThread<kRanksCap>;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t vectors = vectorized ? bytes / 16 : 0;
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

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0; }

int grid_for(std::size_t work, std::size_t cap) {
  const std::size_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<std::size_t>(1, std::min(blocks, cap)));
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

// Calls launch(std::integral_constant<int, cap>) with the smallest of 2, 4,
// kMaxRanks that is >= ranks: a kernel's per-rank arrays as small as the world
// allows, so more vectors are in flight per thread in the same registers.
template <typename Launch>
cudaError_t with_ranks_cap(int ranks, Launch&& launch) {
  if (ranks <= 2) return launch(std::integral_constant<int, 2>{});
  if (ranks <= 4) return launch(std::integral_constant<int, 4>{});
  return launch(std::integral_constant<int, kMaxRanks>{});
}

template <typename T>
cudaError_t reduce_as(const ReduceLaunch& r, cudaStream_t stream) {
  return with_ranks_cap(std::max(r.world, r.n_outs),
                        [&](auto cap) { return reduce_as<T, decltype(cap)::value>(r, stream); });
}

}  // namespace

cudaError_t launch_barrier(const PeerSignals& signals, int world, std::uint32_t* epoch_counter,
                           cudaStream_t stream) {
  barrier_kernel<<<1, 32, 0, stream>>>(signals, world, epoch_counter);
  return cudaGetLastError();
}

cudaError_t launch_signal(const PeerSignals& signals, int peer, std::uint32_t* sent, cudaStream_t stream) {
  signal_kernel<<<1, 1, 0, stream>>>(signals, peer, sent);
  return cudaGetLastError();
}

cudaError_t launch_wait(const PeerSignals& signals, int peer, std::uint32_t* received, cudaStream_t stream) {
  wait_kernel<<<1, 1, 0, stream>>>(signals, peer, received);
  return cudaGetLastError();
}

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

cudaError_t launch_gather_copy(const BlockSync& sync, const PeerPointers& src, char* dst, std::size_t bytes,
                               int world, cudaStream_t stream) {
  bool vectorized = aligned16(dst) && bytes % 16 == 0;
  for (int p = 0; p < world; ++p) vectorized = vectorized && aligned16(src.ptr[p]);
  // 32 blocks at most, as measured (peers_h200x2_2026-11-27_gather-unroll-and-fused-4m.json);
  // 64, the reductions' meeting grid, is not measured for it.
  constexpr std::size_t kGatherBlocks = 32;
  static_assert(kGatherBlocks <= kMaxSyncBlocks, "a block meets its peers on its own row");
  const int blocks = grid_for(bytes / 16 + 1, kGatherBlocks);  // equal on every rank
  return with_ranks_cap(world, [&](auto cap) {
    gather_copy_kernel<decltype(cap)::value>
        <<<blocks, kThreads, 0, stream>>>(sync, src, dst, bytes, world, vectorized);
    return cudaGetLastError();
  });
}

}  // namespace symmpool::detail
