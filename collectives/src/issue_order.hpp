#pragma once
// Runs one communicator's collectives on the GPU in the order they were
// issued, whatever streams they were issued on, as NCCL does for one
// communicator. FSDP2 issues all-gathers and reduce-scatters on two
// streams; without this, ranks could run them in different orders, or at
// once, and their barriers on the shared signal pads would pair the wrong
// collectives or wait forever.
//
// Inside a CUDA graph capture the order holds between collectives of the
// same capture; ordering a graph against eager work is the caller's, as it
// is with NCCL.

#include "call_end_word.hpp"

#include <symmpool/detail/shared_event.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace symmpool::detail {

class IssueOrder {
 public:
  // `end_word`: where eager calls that report their own end end (may be
  // null: none does); outlives us.
  explicit IssueOrder(const CallEndWord* end_word = nullptr) : end_word_(end_word) {}
  // Makes `stream` wait for the collective issued before; returns the
  // capture `stream` is in (0: none), for end().
  unsigned long long begin(cudaStream_t stream);
  // The collective just enqueued on `stream` ends at `done`, recorded there.
  void end(cudaStream_t stream, unsigned long long capture, SharedEvent done);
  // The eager collective `call` just enqueued on `stream` ends when the end
  // word reaches `call` (its kernel writes it).
  void end_at_word(cudaStream_t stream, std::uint64_t call);

 private:
  const CallEndWord* const end_word_;
  SharedEvent eager_;                    // end of the last collective issued outside captures
  std::uint64_t eager_call_ = 0;         // or, nonzero, the call the end word marks the end of
  cudaStream_t eager_stream_ = nullptr;  // the stream eager_ was recorded on
  SharedEvent captured_;                 // end of the last collective issued in capture `capture_id_`
  unsigned long long capture_id_ = 0;
};

}  // namespace symmpool::detail
