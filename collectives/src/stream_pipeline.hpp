#pragma once
// A collective's pieces through three stages on three streams: pull (copy
// engines bring the piece from the peers into a staging slot, on a stream
// of its own), reduce (a local kernel, on the caller's stream) and push
// (copy engines send the result to the peers, on another stream of its
// own), so that piece k + 1 is pulled while piece k is reduced and pushed.
// Forks and joins are events, so a pipeline can be captured in a CUDA graph.
// One pipeline serves either eager calls or captures, never both
// (EagerAndCaptured).

#include "cuda_handles.hpp"

#include <cuda_runtime_api.h>

#include <array>
#include <functional>

namespace symmpool::detail {

class StreamPipeline {
 public:
  static constexpr int kMaxSlots = 4;  // staging slots in flight

  // A stage enqueues its work for one piece, which uses staging slot `slot`, on `stream`.
  using Stage = std::function<void(int piece, int slot, cudaStream_t stream)>;

  // Creates its streams and events on the current device.
  StreamPipeline();

  // Enqueues `pieces` pieces after `stream`'s work so far: piece k's reduce
  // follows its pull and its push follows its reduce; the pull of piece k
  // waits for the reduce of piece k - slots, the last one to read that
  // slot. `push` may be empty (no third stage). Every stage's work is done
  // before later work on `stream` starts, also when a stage throws (what
  // was enqueued is joined, then the error goes on). slots in [1, kMaxSlots].
  void run(int pieces, int slots, cudaStream_t stream, const Stage& pull, const Stage& reduce,
           const Stage& push);

 private:
  UniqueStream pull_ = new_stream();
  UniqueStream push_ = new_stream();
  UniqueEvent fork_ = new_event();
  UniqueEvent joined_ = new_event();  // a side stream's end, joined after a failure
  UniqueEvent pushed_ = new_event();
  std::array<UniqueEvent, kMaxSlots> pulled_;   // per slot: its piece arrived
  std::array<UniqueEvent, kMaxSlots> reduced_;  // per slot: its piece was reduced (the slot is free)
};

}  // namespace symmpool::detail
