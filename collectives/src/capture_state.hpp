#pragma once
// Whether work enqueued on a stream goes into a CUDA graph capture. A
// collective asks once, when it begins (IssueOrder), and hands the answer
// down: every driver query costs host time on the eager hot path.

#include <symmpool/driver_api.hpp>
#include <symmpool/error.hpp>

#include <cuda_runtime_api.h>

namespace symmpool::detail {

// Whether `stream` is capturing, a capture the driver invalidated included
// (work enqueued there fails with a CUDA error instead of running eagerly).
inline bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  SYMMPOOL_CUDA_TRY(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// The active capture `stream` belongs to, or 0 outside captures (ids start
// at 1). Asked of the driver: the runtime's wrapper adds host time to every
// eager call (docs/DESIGN.md, "Life of one collective";
// bench/results/host_time_h200x2_2026-11-27_host-path-through-driver-ab.json).
inline unsigned long long capture_of(cudaStream_t stream) {
  const DriverApi& drv = real_driver();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  SYMMPOOL_CU_TRY(drv, cuStreamGetCaptureInfo(reinterpret_cast<CUstream>(stream), &status, &id, nullptr,
                                              nullptr, nullptr, nullptr));
  return status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? id : 0;
}

// Two sets of a collective's side streams, one for eager calls and one for
// captures. A side stream a capture forked stays in that capture until it
// ends, so an eager call meanwhile (on another stream, which IssueOrder
// allows) must never touch it: its work would land in the graph, or its
// waits on eager events would fail the capture.
template <class Lanes>
class EagerAndCaptured {
 public:
  template <class... Args>
  explicit EagerAndCaptured(const Args&... args) : eager_(args...), captured_(args...) {}

  Lanes& for_call(bool captured) { return captured ? captured_ : eager_; }

 private:
  Lanes eager_;
  Lanes captured_;
};

}  // namespace symmpool::detail
