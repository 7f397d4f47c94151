// Staging memory of the reductions: peers' chunks brought here (two-step),
// or results that would land on an input peers still read (one-shot).

#include "relaxed_capture.hpp"

#include <symmpool/communicator.hpp>
#include <symmpool/error.hpp>

namespace symmpool {

// Plain device memory: peers never read it, and taking it from the heap
// would map segments on some ranks only (a timing-dependent reuse decides),
// which breaks the ranks' equal layouts.
void* Communicator::scratch(std::size_t bytes) {
  if (scratch_bytes_ < bytes) {
    detail::RelaxedCaptureMode relaxed;
    if (scratch_ && (scratch_captured_ || capturing())) {
      retired_scratch_.push_back(scratch_);  // a graph may use it: kept until we go
    } else if (scratch_) {
      SYMMPOOL_CUDA_TRY(cudaFree(scratch_));  // synchronizes with queued work that uses it
    }
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    scratch_captured_ = false;
    SYMMPOOL_CUDA_TRY(cudaMalloc(&scratch_, bytes));
    scratch_bytes_ = bytes;
  }
  scratch_captured_ = scratch_captured_ || capturing();
  return scratch_;
}

}  // namespace symmpool
