#pragma once
// The device side of a meeting between ranks: signals and waits on the
// peers' signal pads, the call check of a call's first meeting, giving up
// on a peer, and the start and end meetings of block-synchronised kernels
// (BlockMeeting). Included by the kernels that meet their peers.

#include "device_common.cuh"
#include "kernels.hpp"

#include <cstdint>

namespace symmpool::detail {

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

}  // namespace symmpool::detail
