#pragma once
// A collective's pieces through three stages on three streams: pull (copy
// engines bring the piece from the peers into a staging slot, on a stream
// of its own), reduce (a local kernel, on the caller's stream) and push
// (copy engines send the result to the peers, on another stream of its
// own), so that piece k + 1 is pulled while piece k is reduced and pushed.
// Forks and joins are events, so a pipeline can be captured in a CUDA graph.

#include <cuda_runtime_api.h>

#include <functional>

namespace symmpool::detail {

class StreamPipeline {
 public:
  static constexpr int kMaxSlots = 4;  // staging slots in flight

  // A stage enqueues its work for one piece, which uses staging slot `slot`, on `stream`.
  using Stage = std::function<void(int piece, int slot, cudaStream_t stream)>;

  // Creates its streams and events on the current device.
  StreamPipeline();
  ~StreamPipeline();
  StreamPipeline(const StreamPipeline&) = delete;
  StreamPipeline& operator=(const StreamPipeline&) = delete;

  // Enqueues `pieces` pieces after `stream`'s work so far: piece k's reduce
  // follows its pull and its push follows its reduce; the pull of piece k
  // waits for the reduce of piece k - slots, the last one to read that
  // slot. `push` may be empty (no third stage). Every stage's work is done
  // before later work on `stream` starts. slots in [1, kMaxSlots].
  void run(int pieces, int slots, cudaStream_t stream, const Stage& pull, const Stage& reduce,
           const Stage& push);

 private:
  cudaStream_t pull_stream_ = nullptr;
  cudaStream_t push_stream_ = nullptr;
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t pushed_ = nullptr;
  cudaEvent_t pulled_[kMaxSlots] = {};
  cudaEvent_t reduced_[kMaxSlots] = {};
};

}  // namespace symmpool::detail
