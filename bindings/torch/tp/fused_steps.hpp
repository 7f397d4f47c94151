#pragma once
// The steps the fused ops' pipelines are made of (fused_pipelines.cpp
// micro-pipelines them shard by shard, fused_one_shot.cpp runs each once):
// ordering a call's use of the group's workspace, meetings, copies, matmuls
// into views, and the host-time trace.

#include "tp/fused_workspace.hpp"

#include <symmpool/communicator.hpp>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace symmpool::torch_ext {

// One call's use of the workspace, on the caller's stream `main`: it starts
// after the previous op's use (which may have been on another stream);
// finish() records where it left the workspace. A call that throws before
// finish() still has the caller's stream join whatever it gave the copy
// stream (under a capture only once the copy stream was forked from it: a
// wait on work outside the capture would end the capture) and records its
// use. Graph replays are not tracked: replaying a graph with fused ops on
// one stream while fused ops run on another is the caller's to order.
class WorkspaceUse {
 public:
  WorkspaceUse(FusedWorkspace& ws, c10::DeviceIndex device);
  WorkspaceUse(const WorkspaceUse&) = delete;
  WorkspaceUse& operator=(const WorkspaceUse&) = delete;
  ~WorkspaceUse();

  const c10::cuda::CUDAStream& main() const { return main_; }
  const c10::cuda::CUDAStream& copies() const { return copies_; }
  bool capturing() const { return capturing_; }
  at::cuda::CUDAEvent& joined() { return ws_.joined; }
  const at::Tensor& buffer() const { return ws_.buffer; }
  FusedWorkspace& workspace() { return ws_; }

  // The copy stream starts after what the caller's stream has so far.
  void fork();
  // Everything is enqueued and the caller's stream has joined the copy
  // stream: record where the workspace was left (a failure raises).
  void finish();

 private:
  FusedWorkspace& ws_;
  c10::cuda::CUDAStream main_;
  bool capturing_;
  c10::cuda::CUDAStream copies_;  // the workspace's copy stream for eager ops, or for captured ones
  bool forked_ = false;
  bool finished_ = false;
};

// Where one call's host time goes, step by step (SYMMPOOL_DEBUG=TRACE,
// subsystem TP): one line per call, each step's microseconds. Eager
// tensor parallelism at small batch is bound by this time.
class HostSteps {
 public:
  explicit HostSteps(const char* op);
  HostSteps(const HostSteps&) = delete;
  HostSteps& operator=(const HostSteps&) = delete;
  ~HostSteps();

  void mark(const char* step) {
    if (on_) mark_now(step);
  }

 private:
  void mark_now(const char* step);

  const char* op_;
  const bool on_;
  std::chrono::steady_clock::time_point last_;
  std::string steps_;
};

// The largest gathered A (all-gather then matmul) or whole product (matmul
// then reduce-scatter or all-to-all), in bytes, that a fused op moves in
// one step with one matmul rather than pipelined shard by shard
// (SYMMPOOL_TP_ONE_SHOT_BYTES; docs/usage.md gives the default's grounds).
std::int64_t one_shot_bytes();

// `to`'s later work starts after `from`'s earlier work.
void wait_stream(const c10::cuda::CUDAStream& to, const c10::cuda::CUDAStream& from,
                 at::cuda::CUDAEvent& event);

// A stream-memory-op barrier of the group on `stream` (a kernel under capture).
void meet(Communicator& comm, const c10::cuda::CUDAStream& stream);

void copy_bytes(void* dst, const void* src, std::size_t bytes, const c10::cuda::CUDAStream& stream);

// out = a @ b, out a view (mm_out takes it by non-const reference).
inline void mm_into(at::Tensor out, const at::Tensor& a, const at::Tensor& b) { at::mm_out(out, a, b); }

inline std::size_t bytes_of(const at::Tensor& t) {
  return static_cast<std::size_t>(t.numel()) * t.element_size();
}

// This rank's workspace viewed as a contiguous tensor of `sizes` and `dtype`.
at::Tensor staging(const at::Tensor& workspace, at::IntArrayRef sizes, at::ScalarType dtype);

void check_matrix(const at::Tensor& t, const char* name);

// What the caller gets of the slots that the ranks' chunks landed in: their
// sum or mean (reduce-scatter), or a copy (all-to-all). Never the workspace
// itself, which the group's next fused op overwrites.
at::Tensor combine(const at::Tensor& stacked, const std::string& how);

}  // namespace symmpool::torch_ext
