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

 private:
  CUstreamBatchMemOpParams& add();

  std::array<CUstreamBatchMemOpParams, kCapacity> ops_{};
  int count_ = 0;
};

}  // namespace symmpool::detail
