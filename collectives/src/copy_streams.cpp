#include "copy_streams.hpp"

#include <symmpool/detail/scope_exit.hpp>
#include <symmpool/error.hpp>

#include <algorithm>

namespace symmpool::detail {

void copy_on(cudaStream_t stream, void* dst, const void* src, std::size_t bytes) {
  SYMMPOOL_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

void CopyStreams::make(Lanes& lanes, int streams) {
  SYMMPOOL_CUDA_TRY(cudaEventCreateWithFlags(&lanes.fork, cudaEventDisableTiming));
  SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&lanes.local, cudaStreamNonBlocking));
  SYMMPOOL_CUDA_TRY(cudaEventCreateWithFlags(&lanes.local_fork, cudaEventDisableTiming));
  SYMMPOOL_CUDA_TRY(cudaEventCreateWithFlags(&lanes.local_join, cudaEventDisableTiming));
  for (int i = 1; i < streams; ++i) {
    cudaStream_t s = nullptr;
    cudaEvent_t e = nullptr;
    SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    lanes.side.push_back(s);
    SYMMPOOL_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    lanes.joins.push_back(e);
  }
}

void CopyStreams::destroy(Lanes& lanes) {
  for (cudaStream_t s : lanes.side) cudaStreamDestroy(s);
  for (cudaEvent_t e : lanes.joins) cudaEventDestroy(e);
  for (cudaEvent_t e : {lanes.fork, lanes.local_fork, lanes.local_join})
    if (e) cudaEventDestroy(e);
  if (lanes.local) cudaStreamDestroy(lanes.local);
  lanes = Lanes{};
}

CopyStreams::CopyStreams(int streams) {
  ScopeExit undo([this] {
    destroy(eager_);
    destroy(captured_);
  });
  make(eager_, streams);
  make(captured_, streams);
  undo.dismiss();
}

CopyStreams::~CopyStreams() {
  destroy(eager_);
  destroy(captured_);
}

CopyStreams::Lanes& CopyStreams::lanes_for(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SYMMPOOL_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
  return capture == cudaStreamCaptureStatusNone ? eager_ : captured_;
}

void CopyStreams::start_local(const Copy& local, cudaStream_t stream) {
  Lanes& lanes = lanes_for(stream);
  SYMMPOOL_CUDA_TRY(cudaEventRecord(lanes.local_fork, stream));
  SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(lanes.local, lanes.local_fork, 0));
  if (local.bytes > 0) copy_on(lanes.local, local.dst, local.src, local.bytes);
  SYMMPOOL_CUDA_TRY(cudaEventRecord(lanes.local_join, lanes.local));
}

void CopyStreams::join_local(cudaStream_t stream) {
  SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(stream, lanes_for(stream).local_join, 0));
}

void CopyStreams::issue(const std::vector<Copy>& copies, cudaStream_t stream) {
  auto copy = [](const Copy& c, std::size_t from, std::size_t bytes, cudaStream_t s) {
    if (bytes > 0)
      copy_on(s, static_cast<char*>(c.dst) + from, static_cast<const char*>(c.src) + from, bytes);
  };
  Lanes& lanes = lanes_for(stream);
  if (lanes.side.empty()) {
    for (const Copy& c : copies) copy(c, 0, c.bytes, stream);
    return;
  }
  SYMMPOOL_CUDA_TRY(cudaEventRecord(lanes.fork, stream));
  for (cudaStream_t s : lanes.side) SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(s, lanes.fork, 0));
  const std::size_t parts = lanes.side.size() + 1;
  for (const Copy& c : copies) {
    // 16-byte-aligned parts keep every engine on whole vectors.
    const std::size_t part = (c.bytes / parts + 15) / 16 * 16;
    for (std::size_t i = 0; i < parts; ++i) {
      const std::size_t from = std::min(c.bytes, i * part);
      const std::size_t bytes = i + 1 == parts ? c.bytes - from : std::min(part, c.bytes - from);
      copy(c, from, bytes, i == 0 ? stream : lanes.side[i - 1]);
    }
  }
  for (std::size_t i = 0; i < lanes.side.size(); ++i) {
    SYMMPOOL_CUDA_TRY(cudaEventRecord(lanes.joins[i], lanes.side[i]));
    SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(stream, lanes.joins[i], 0));
  }
}

}  // namespace symmpool::detail
