#include "tp/fused_steps.hpp"

#include "stream_capture.hpp"
#include "torch_errors.hpp"

#include <symmpool/env_reader.hpp>
#include <symmpool/error.hpp>
#include <symmpool/log.hpp>

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>

namespace symmpool::torch_ext {

using c10::cuda::CUDAStream;

WorkspaceUse::WorkspaceUse(FusedWorkspace& ws, c10::DeviceIndex device)
    : ws_(ws),
      main_(c10::cuda::getCurrentCUDAStream(device)),
      capturing_(is_capturing(main_)),
      copies_(capturing_ ? ws.captured_copies : ws.copies) {
  TORCH_CHECK(ws.buffer.defined(), "symmpool fused ops: the workspace was never sized");
  // A stream runs its own work in order (cudaStreamPerThread names a
  // different stream in each thread).
  const bool same_stream = main_.stream() == ws.last_use_stream && main_.stream() != cudaStreamPerThread;
  if (!capturing_ && !same_stream) ws.last_use.block(main_);
  ws.captured = ws.captured || capturing_;
}

WorkspaceUse::~WorkspaceUse() {
  if (finished_) return;
  try {
    if (forked_ || !capturing_) wait_stream(main_, copies_, ws_.joined);
  } catch (const std::exception& e) {
    SYMMPOOL_WARN(kTp, "fused ops: joining the copy stream after a failed call failed: %s", e.what());
  }
  try {
    if (!capturing_) ws_.record_use(main_);
  } catch (const std::exception& e) {
    SYMMPOOL_WARN(kTp, "fused ops: recording the workspace's use after a failed call failed: %s", e.what());
  }
}

void WorkspaceUse::fork() {
  wait_stream(copies_, main_, ws_.joined);
  forked_ = true;
}

void WorkspaceUse::finish() {
  finished_ = true;
  if (!capturing_) ws_.record_use(main_);
}

HostSteps::HostSteps(const char* op) : op_(op), on_(log::enabled(log::Level::kTrace, log::kTp)) {
  if (on_) last_ = std::chrono::steady_clock::now();
}

HostSteps::~HostSteps() {
  if (on_) SYMMPOOL_TRACE(kTp, "%s host us:%s", op_, steps_.c_str());
}

void HostSteps::mark_now(const char* step) {
  const auto now = std::chrono::steady_clock::now();
  const double us = std::chrono::duration<double, std::micro>(now - last_).count();
  last_ = now;
  char text[64];
  std::snprintf(text, sizeof(text), " %s=%.1f", step, us);
  steps_ += text;
}

namespace {

constexpr std::int64_t kDefaultOneShotBytes = 4 << 20;

std::int64_t read_one_shot_bytes() {
  try {
    return env::whole_number(env::value("SYMMPOOL_TP_ONE_SHOT_BYTES"), "SYMMPOOL_TP_ONE_SHOT_BYTES",
                             kDefaultOneShotBytes, 0, std::numeric_limits<std::int64_t>::max());
  } catch (const logic_error& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

}  // namespace

std::int64_t one_shot_bytes() {
  static const std::int64_t bytes = read_one_shot_bytes();
  return bytes;
}

void wait_stream(const CUDAStream& to, const CUDAStream& from, at::cuda::CUDAEvent& event) {
  event.record(from);
  event.block(to);
}

void meet(Communicator& comm, const CUDAStream& stream) {
  call_translating_errors([&] {
    comm.barrier(stream.stream(), BarrierKind::kStreamOps);
    return 0;
  });
}

void copy_bytes(void* dst, const void* src, std::size_t bytes, const CUDAStream& stream) {
  C10_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream.stream()));
}

at::Tensor staging(const at::Tensor& workspace, at::IntArrayRef sizes, at::ScalarType dtype) {
  std::int64_t count = 1;
  for (std::int64_t s : sizes) count *= s;
  const std::int64_t bytes = count * static_cast<std::int64_t>(c10::elementSize(dtype));
  TORCH_CHECK(bytes <= workspace.numel(), "symmpool fused ops: the workspace holds ", workspace.numel(),
              " bytes, ", bytes, " are needed");
  // One tensor made over the workspace's bytes (three views cost three
  // dispatches); the workspace outlives the call that uses it.
  // target_device: the pointer is not asked which device it is on.
  return at::for_blob(workspace.data_ptr(), sizes)
      .options(workspace.options().dtype(dtype))
      .target_device(workspace.device())
      .make_tensor();
}

void check_matrix(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.dim() == 2, "symmpool fused ops: ", name, " must be a CUDA matrix, got ",
              t.sizes());
}

at::Tensor combine(const at::Tensor& stacked, const std::string& how) {
  // Two slots: one elementwise add, round(a + b) as the sum gives (but for
  // -0 + -0: -0, as NCCL's sum, where at::sum starts from +0). at::sum
  // over the outer dim of a [2, rows, cols] stack runs far below the
  // device's bandwidth
  // (bench/results/tp_ops_split_cost_h200x1_2026-11-26_with-reduce-scatter-sum.json).
  if (how == "sum" && stacked.size(0) == 2) return at::add(stacked[0], stacked[1]);
  if (how == "sum") return at::sum(stacked, 0);
  if (how == "avg") return at::mean(stacked, 0);
  return stacked.clone();
}

}  // namespace symmpool::torch_ext
