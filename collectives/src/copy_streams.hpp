#pragma once
// Device-to-device copies of one collective, issued on the caller's stream
// alone or split over it and side streams (so more copy engines move one
// peer's data), joined back before the caller's stream goes on; and a copy
// within this GPU on a stream of its own, beside them. Forks and joins are
// events, so the copies can be captured in a CUDA graph. One set serves
// either eager calls or captures, never both (EagerAndCaptured).

#include "cuda_handles.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace symmpool::detail {

struct Copy {
  void* dst;
  const void* src;
  std::size_t bytes;
};

// One device-to-device copy on `stream`.
void copy_on(cudaStream_t stream, void* dst, const void* src, std::size_t bytes);

class CopyStreams {
 public:
  // `streams` in [1, 8]: 1 issues every copy on the caller's stream.
  // Creates its side streams on the current device.
  explicit CopyStreams(int streams);

  // Each copy is cut into one part per stream, in order.
  void issue(const std::vector<Copy>& copies, cudaStream_t stream);

  // `local` (within this GPU: an out-of-place all-gather's own slice) on a
  // stream of its own, after `stream`'s work so far, so that it runs beside
  // the copies over NVLink instead of after them; join_local(stream) makes
  // `stream` wait for it. One at a time.
  void start_local(const Copy& local, cudaStream_t stream);
  void join_local(cudaStream_t stream);

 private:
  std::vector<UniqueStream> side_;
  std::vector<UniqueEvent> joins_;  // one per side stream
  UniqueEvent fork_ = new_event();
  UniqueStream local_ = new_stream();
  UniqueEvent local_fork_ = new_event();
  UniqueEvent local_join_ = new_event();
};

}  // namespace symmpool::detail
