#pragma once
// Per-rank device pointers and barrier state handed to kernels by value.

#include <cstddef>
#include <cstdint>

namespace symmpool::detail {

constexpr int kMaxRanks = 8;
// Blocks of a kernel that synchronises with its peers block by block; each
// block has its own row of signal pads and its own epoch. 128 for the
// two-shot all-reduce at 2 ranks (algorithm_table.hpp, fused_kernel_limit).
constexpr int kMaxSyncBlocks = 128;

struct PeerPointers {
  const void* ptr[kMaxRanks];
};

struct OutPointers {
  void* ptr[kMaxRanks];
};

struct PadPointers {
  std::uint32_t* peer[kMaxRanks];  // each rank's signal pads, as mapped here
};

// Signal pads: one row of kMaxRanks words per user, the same on every rank.
enum PadRow : int {
  kKernelBarrierRow = 0,
  kStreamOpBarrierRow = 1,
  kFirstBlockRow = 2,                            // kMaxSyncBlocks rows follow
  kSignalRow = kFirstBlockRow + kMaxSyncBlocks,  // point-to-point signals of kernels (in CUDA graphs)
  kStreamOpSignalRow,                            // point-to-point signals of stream memops (eager)
  kCallRow,                                      // each rank's digest of its current call (call_check.hpp)
};
constexpr int kPadRows = kCallRow + 1;
// Block meetings' start signals: 64-bit words [kMaxSyncBlocks][kMaxRanks]
// at this byte offset of every rank's pads, each holding the meeting's
// value (high half) and the call's digest (low half): one store carries
// both, so the digest needs no fence to arrive with the signal.
constexpr std::size_t kStartWordsOffset = 5120;
// Call words: 64-bit words [kMaxRanks] at this byte offset of every rank's
// pads, rank r's holding the number (high half, low 32 bits of it) and the
// digest (low half) of r's call at its last first meeting, in one store.
// A first meeting's wait looks at them now and then: a peer at the same
// call number with another digest is at another call, which may meet its
// peers elsewhere (a fused kernel's start words, a barrier kernel's row)
// and never signal this wait.
constexpr std::size_t kCallWordsOffset = kStartWordsOffset + std::size_t{kMaxSyncBlocks} * kMaxRanks * 8;
// Checked meetings' pairs (stream_op_batch.hpp): 64-bit words [kMaxRanks][2]
// at this byte offset of every rank's pads, rank r's pair written by rank r.
constexpr std::size_t kCheckedPairsOffset = kCallWordsOffset + std::size_t{kMaxRanks} * 8;

// How a communicator's kernels report a failure and learn of one.
struct FailureWords {
  int* error_flag = nullptr;        // host-mapped ErrorWords: 1 + a rank that never signalled, ...
  std::uint32_t* failed = nullptr;  // this rank's, in device memory: nonzero once a wait gave up or
                                    // calls differed; later kernels then leave peers alone
  long long timeout_cycles = 0;     // how long a wait lasts before it gives up
};

// What a kernel needs to signal its peers and wait for their signals (the
// kernels take the world size on its own: they loop over it too).
struct PeerSignals {
  PadPointers peers{};  // pads of every rank, mapped here
  std::uint32_t* my_pads = nullptr;
  int rank = 0;
  FailureWords failure;
  // Nonzero at a call's first meeting: the call's digest, written into each
  // peer's call row before the signal and compared with theirs after the wait.
  std::uint32_t call = 0;
  // With `call`: the call's number (low 32 bits), written beside the digest
  // into each peer's call word.
  std::uint32_t call_number = 0;
};

// What a kernel needs to meet its peers at its start and its end.
struct BlockSync {
  bool enabled = false;  // false: the caller brackets the kernel with barriers
  PeerSignals signals;
  std::uint32_t* block_epochs = nullptr;  // [kMaxSyncBlocks], this rank's only
};

}  // namespace symmpool::detail
