#pragma once
// Where eager calls whose kernel reports its own end (the low-latency
// all-reduce) end: the kernel's last block writes the call's number into a
// host-mapped 64-bit word as its last act, so the call records no CUDA
// event (cuEventRecord was a large share of an eager small all-reduce's host
// time: bench/peers/README.md,
// bench/results/host_time_h200x2_2026-11-27_call-end-word-ab.json). The
// failure monitor reads the word to retire such calls; the issue order makes
// another stream wait for it with a stream memop. Calls end in the order
// issued, so the word only grows.

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

namespace symmpool::detail {

class CallEndWord {
 public:
  // Null where the device takes no 64-bit stream memops (its calls then
  // record events, as every other call does).
  static std::unique_ptr<CallEndWord> make_if_supported(int device);
  ~CallEndWord();
  CallEndWord(const CallEndWord&) = delete;
  CallEndWord& operator=(const CallEndWord&) = delete;

  // For the kernel: where its last block writes the call's number.
  std::uint64_t* for_kernel() const { return word_; }
  // Whether call `call` (or a later one ending here) has ended.
  bool reached(std::uint64_t call) const { return __atomic_load_n(word_, __ATOMIC_ACQUIRE) >= call; }
  // Holds `stream` until call `call` has ended (cuStreamBatchMemOp, GEQ).
  void make_wait(cudaStream_t stream, std::uint64_t call) const;

 private:
  explicit CallEndWord(std::uint64_t* word) : word_(word) {}
  std::uint64_t* word_;  // host-mapped, written by kernels
};

}  // namespace symmpool::detail
