#include "copy_streams.hpp"

#include <symmpool/error.hpp>

#include <algorithm>

namespace symmpool::detail {

void copy_on(cudaStream_t stream, void* dst, const void* src, std::size_t bytes) {
  SYMMPOOL_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

CopyStreams::CopyStreams(int streams) {
  for (int i = 1; i < streams; ++i) {
    side_.push_back(new_stream());
    joins_.push_back(new_event());
  }
}

void CopyStreams::start_local(const Copy& local, cudaStream_t stream) {
  SYMMPOOL_CUDA_TRY(cudaEventRecord(local_fork_.get(), stream));
  SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(local_.get(), local_fork_.get(), 0));
  if (local.bytes > 0) copy_on(local_.get(), local.dst, local.src, local.bytes);
  SYMMPOOL_CUDA_TRY(cudaEventRecord(local_join_.get(), local_.get()));
}

void CopyStreams::join_local(cudaStream_t stream) {
  SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(stream, local_join_.get(), 0));
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
  SYMMPOOL_CUDA_TRY(cudaEventRecord(fork_.get(), stream));
  for (const UniqueStream& s : side_) SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(s.get(), fork_.get(), 0));
  const std::size_t parts = side_.size() + 1;
  for (const Copy& c : copies) {
    // 16-byte-aligned parts keep every engine on whole vectors.
    const std::size_t part = (c.bytes / parts + 15) / 16 * 16;
    for (std::size_t i = 0; i < parts; ++i) {
      const std::size_t from = std::min(c.bytes, i * part);
      const std::size_t bytes = i + 1 == parts ? c.bytes - from : std::min(part, c.bytes - from);
      copy(c, from, bytes, i == 0 ? stream : side_[i - 1].get());
    }
  }
  for (std::size_t i = 0; i < side_.size(); ++i) {
    SYMMPOOL_CUDA_TRY(cudaEventRecord(joins_[i].get(), side_[i].get()));
    SYMMPOOL_CUDA_TRY(cudaStreamWaitEvent(stream, joins_[i].get(), 0));
  }
}

}  // namespace symmpool::detail
