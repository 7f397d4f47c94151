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
  if (scratch_.bytes < bytes) {
    detail::RelaxedCaptureMode relaxed;
    if (scratch_.ptr && (scratch_.captured || capturing())) {
      scratch_.retired.push_back(scratch_.ptr);  // a graph may use it: kept until we go
    } else if (scratch_.ptr) {
      SYMMPOOL_CUDA_TRY(cudaFree(scratch_.ptr));  // synchronizes with queued work that uses it
    }
    scratch_.ptr = nullptr;
    scratch_.bytes = 0;
    scratch_.captured = false;
    SYMMPOOL_CUDA_TRY(cudaMalloc(&scratch_.ptr, bytes));
    scratch_.bytes = bytes;
  }
  scratch_.captured = scratch_.captured || capturing();
  return scratch_.ptr;
}

}  // namespace symmpool
