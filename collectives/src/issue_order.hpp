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

#include <symmpool/detail/shared_event.hpp>

#include <cuda_runtime_api.h>

namespace symmpool::detail {

class IssueOrder {
 public:
  // Makes `stream` wait for the collective issued before; returns the
  // capture `stream` is in (0: none), for end().
  unsigned long long begin(cudaStream_t stream);
  // The collective just enqueued on `stream` ends at `done`, recorded there.
  void end(cudaStream_t stream, unsigned long long capture, SharedEvent done);

 private:
  SharedEvent eager_;                    // end of the last collective issued outside captures
  cudaStream_t eager_stream_ = nullptr;  // the stream eager_ was recorded on
  SharedEvent captured_;                 // end of the last collective issued in capture `capture_id_`
  unsigned long long capture_id_ = 0;
};

}  // namespace symmpool::detail
