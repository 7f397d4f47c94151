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
  // A barrier's worth: a write to and a wait on each rank, and two notes.
  static constexpr int kCapacity = 2 * kMaxRanks + 2;
  static_assert(kCapacity < 256, "cuStreamBatchMemOp takes fewer than 256 operations");

  // Writes `value` to the word at `address` once the stream's earlier work
  // is done, behind a memory fence (what cuStreamWriteValue32 does by default).
  void write(CUdeviceptr address, std::uint32_t value);
  // Holds the stream until the word at `address` is at or past `value`
  // (compared modulo 2^32, as cuStreamWaitValue32's GEQ does).
  void wait_at_least(CUdeviceptr address, std::uint32_t value);
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

// One wait for `value` at `slot` between the watchdog's notes.
void add_watched_wait(StreamOpBatch& batch, CUdeviceptr slot, std::uint32_t value, WatchNotes notes);

}  // namespace symmpool::detail
