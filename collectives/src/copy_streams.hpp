#pragma once
// Device-to-device copies of one collective, issued on the caller's stream
// alone or split over it and side streams (so more copy engines move one
// peer's data), joined back before the caller's stream goes on; and a copy
// within this GPU on a stream of its own, beside them. Forks and joins are
// events, so the copies can be captured in a CUDA graph.

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
  ~CopyStreams();
  CopyStreams(const CopyStreams&) = delete;
  CopyStreams& operator=(const CopyStreams&) = delete;

  // Each copy is cut into one part per stream, in order.
  void issue(const std::vector<Copy>& copies, cudaStream_t stream);

  // `local` (within this GPU: an out-of-place all-gather's own slice) on a
  // stream of its own, after `stream`'s work so far, so that it runs beside
  // the copies over NVLink instead of after them; join_local(stream) makes
  // `stream` wait for it. One at a time.
  void start_local(const Copy& local, cudaStream_t stream);
  void join_local(cudaStream_t stream);

 private:
  // The side streams and their events. A stream a capture forked stays in
  // that capture until it ends, so captures get a set of their own: an
  // eager call meanwhile (on another stream, which IssueOrder allows) never
  // touches a captured stream, where its copies would land in the graph.
  struct Lanes {
    std::vector<cudaStream_t> side;
    std::vector<cudaEvent_t> joins;
    cudaEvent_t fork = nullptr;
    cudaStream_t local = nullptr;
    cudaEvent_t local_fork = nullptr, local_join = nullptr;
  };
  static void make(Lanes& lanes, int streams);
  static void destroy(Lanes& lanes);
  Lanes& lanes_for(cudaStream_t stream);

  Lanes eager_;
  Lanes captured_;
};

}  // namespace symmpool::detail
