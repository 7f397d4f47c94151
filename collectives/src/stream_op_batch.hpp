#pragma once
// Stream memory operations gathered into one cuStreamBatchMemOp call. An
// eager stream-op barrier of n ranks is n writes, n waits and the watchdog's
// two notes; enqueued one by one that is 2n + 2 driver calls of host time on
// every eager collective, batched it is one. The driver runs the operations
// in the order they were added.

#include <symmpool/detail/peer_pointers.hpp>
#include <symmpool/driver_api.hpp>

#include <cuda.h>

#include <array>
#include <cstdint>

namespace symmpool::detail {

class StreamOpBatch {
 public:
  // A checked meeting's worth: three writes to and two waits on each rank, and two notes.
  static constexpr int kCapacity = 5 * kMaxRanks + 2;
  static_assert(kCapacity < 256, "cuStreamBatchMemOp takes fewer than 256 operations");

  // Writes `value` to the word at `address` once the stream's earlier work
  // is done, behind a memory fence (what cuStreamWriteValue32 does by default).
  void write(CUdeviceptr address, std::uint32_t value);
  // Holds the stream until the word at `address` is at or past `value`
  // (compared modulo 2^32, as cuStreamWaitValue32's GEQ does).
  void wait_at_least(CUdeviceptr address, std::uint32_t value);
  // The same on 64-bit words (8-byte aligned; compared modulo 2^64). The
  // device must take 64-bit stream memops (checked_meetings_supported).
  void write64(CUdeviceptr address, std::uint64_t value);
  void wait_at_least64(CUdeviceptr address, std::uint64_t value);
  // One driver call for every operation added, in order; empties the batch.
  // Throws symmpool::cuda_error naming the call when the driver refuses it.
  void enqueue(const DriverApi& drv, CUstream stream);
  int size() const { return count_; }
  const CUstreamBatchMemOpParams& operation(int i) const { return ops_.at(static_cast<std::size_t>(i)); }

 private:
  CUstreamBatchMemOpParams& add();

  std::array<CUstreamBatchMemOpParams, kCapacity> ops_{};
  int count_ = 0;
};

// Where the stream-op watchdog's notes go: the stream writes a channel's
// value into `reached` when it gets to the channel's waits and into `passed`
// once they passed (StreamOpWatchdog::issue).
struct WatchNotes {
  CUdeviceptr reached = 0, passed = 0;
};

// A stream-op barrier of `ranks` ranks, in order: `value` into our slot of
// every rank's pad (`to_peers[r]`), the reached note, a wait for `value` on
// every rank's slot of our pad (`mine[r]`), the passed note.
void add_barrier(StreamOpBatch& batch, const CUdeviceptr* to_peers, const CUdeviceptr* mine, int ranks,
                 std::uint32_t value, WatchNotes notes);

// A call's first meeting by stream memops that also compares the ranks'
// call digests, with waits that only go on (GEQ), so the watchdog can
// release them as it does a barrier's. Each rank writes two 64-bit words
// into its pair of slots on every rank: checked_low(epoch, digest) and
// checked_high(epoch, digest); each waits for at least both of its own
// values in every rank's pair. At one epoch the first holds only where the
// peer's digest is at least ours, the second only where it is at most ours:
// both, only where they are equal. A later epoch passes both: a peer gets
// there through this meeting, having found our digest equal to its own, or
// (the limit these meetings share with plain stream-op barriers) once its
// communicator failed and its watchdog let its waits go, when its stream's
// queued meetings still write (a failed rank's kernels signal no one). A
// rank that then passes unchecked fails at its next meeting with that peer. `to_peers[r]` and `mine[r]`: rank
// r's pair (low word first). A rank at another call blocks the wait until the watchdog's timeout, which tells
// it (a digest that differs) from a rank that never came. Each rank's call word (`call_words[r]`: ours in
// rank r's pads) gets the call's number and digest first, as a barrier kernel announces them, so a peer
// meeting in a kernel sees at once that this rank is at another call.
constexpr std::uint64_t checked_low(std::uint32_t epoch, std::uint32_t digest) {
  return (std::uint64_t{epoch} << 32) | digest;
}
constexpr std::uint64_t checked_high(std::uint32_t epoch, std::uint32_t digest) {
  return (std::uint64_t{epoch} << 32) | static_cast<std::uint32_t>(~digest);
}
void add_checked_meeting(StreamOpBatch& batch, const CUdeviceptr* to_peers, const CUdeviceptr* mine,
                         const CUdeviceptr* call_words, int ranks, std::uint32_t epoch, std::uint32_t digest,
                         std::uint32_t call_number, WatchNotes notes);

// One wait for `value` at `slot` between the watchdog's notes.
void add_watched_wait(StreamOpBatch& batch, CUdeviceptr slot, std::uint32_t value, WatchNotes notes);

}  // namespace symmpool::detail
