#include "copy_streams.hpp"

#include <symmpool/error.hpp>

#include <algorithm>

namespace symmpool::detail {

void copy_on(cudaStream_t stream, void* dst, const void* src, std::size_t bytes) {
  SYMMPOOL_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

CopyStreams::CopyStreams(int streams) {
  SYMMPOOL_CUDA_TRY(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&local_, cudaStreamNonBlocking));
  SYMMPOOL_CUDA_TRY(cudaEventCreateWithFlags(&local_fork_, cudaEventDisableTiming));
  SYMMPOOL_CUDA_TRY(cudaEventCreateWithFlags(&local_join_, cudaEventDisableTiming));
  for (int i = 1; i < streams; ++i) {
    cudaStream_t s = nullptr;
    cudaEvent_t e = nullptr;
    SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    side_.push_back(s);
    SYMMPOOL_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    joins_.push_back(e);
  }
}

CopyStreams::~CopyStreams() {
  for (cudaStream_t s : side_) cudaStreamDestroy(s);
  for (cudaEvent_t e : joins_) cudaEventDestroy(e);
  cudaEventDestroy(fork_);
  cudaStreamDestroy(local_);
  cudaEventDestroy(local_fork_);
  cudaEventDestroy(local_join_);
}

void CopyStreams::start_local(const Copy& local, cudaStream_t stream) {
  SYMMPOOL_CUDA_TRY(cudaEventRecord(local_fork_, stream));
  SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(local_, local_fork_, 0));
  if (local.bytes > 0) copy_on(local_, local.dst, local.src, local.bytes);
  SYMMPOOL_CUDA_TRY(cudaEventRecord(local_join_, local_));
}

void CopyStreams::join_local(cudaStream_t stream) {
  SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(stream, local_join_, 0));
}

void CopyStreams::issue(const std::vector<Copy>& copies, cudaStream_t stream) {
  auto copy = [](const Copy& c, std::size_t from, std::size_t bytes, cudaStream_t s) {
    if (bytes > 0)
      copy_on(s, static_cast<char*>(c.dst) + from, static_cast<const char*>(c.src) + from, bytes);
  };
  if (side_.empty()) {
    for (const Copy& c : copies) copy(c, 0, c.bytes, stream);
    return;
  }
  SYMMPOOL_CUDA_TRY(cudaEventRecord(fork_, stream));
  for (cudaStream_t s : side_) SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(s, fork_, 0));
  const std::size_t parts = side_.size() + 1;
  for (const Copy& c : copies) {
    // 16-byte-aligned parts keep every engine on whole vectors.
    const std::size_t part = (c.bytes / parts + 15) / 16 * 16;
    for (std::size_t i = 0; i < parts; ++i) {
      const std::size_t from = std::min(c.bytes, i * part);
      const std::size_t bytes = i + 1 == parts ? c.bytes - from : std::min(part, c.bytes - from);
      copy(c, from, bytes, i == 0 ? stream : side_[i - 1]);
    }
  }
  for (std::size_t i = 0; i < side_.size(); ++i) {
    SYMMPOOL_CUDA_TRY(cudaEventRecord(joins_[i], side_[i]));
    SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(stream, joins_[i], 0));
  }
}

}  // namespace symmpool::detail
