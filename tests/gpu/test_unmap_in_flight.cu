// Blocks freed in stream order while a kernel still uses them, on a real
// GPU: empty_cache must wait for the device before it unmaps, or the
// kernel's late write lands on memory that is gone (an illegal address); a
// segment another stream takes must make that stream wait, or the kernel's
// late write overwrites the new owner's data.

#include "gpu_skip.hpp"

#include <symmpool/caching_allocator.hpp>
#include <symmpool/device_allocators.hpp>

#include <cuda_runtime_api.h>

#include <vector>

namespace symmpool::test {

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Writes `value` into every one of `count` words, after a pause.
__global__ void late_fill(int* words, std::size_t count, int value, long long pause_ns) {
  for (long long waited = 0; waited < pause_ns; waited += 1000) __nanosleep(1000);
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
    words[i] = value;
}

}  // namespace

TEST(RealAllocator, EmptyCacheWaitsForAKernelStillUsingAFreedBlock) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  CUDA_OK(cudaSetDevice(0));
  CachingAllocator a(std::make_unique<SegmentArena>(real_driver(), 0));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const std::size_t bytes = 64 * kMiB;
  auto* words = static_cast<int*>(a.allocate(bytes, reinterpret_cast<CUstream>(s)));
  late_fill<<<8, 256, 0, s>>>(words, bytes / sizeof(int), 7, 200'000'000);  // 0.2 s, then writes
  CUDA_OK(cudaGetLastError());
  a.deallocate(words, reinterpret_cast<CUstream>(s));  // in stream order: the kernel still runs
  EXPECT_EQ(a.empty_cache(), bytes);
  const cudaError_t done = cudaStreamSynchronize(s);
  EXPECT_EQ(done, cudaSuccess) << "the kernel's write after empty_cache failed: " << cudaGetErrorString(done);
  EXPECT_EQ(a.stats().segments.current, 0);
  cudaStreamDestroy(s);
}

TEST(RealAllocator, ASegmentTakenByAnotherStreamWaitsForItsOldStream) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  CUDA_OK(cudaSetDevice(0));
  CachingAllocator a(std::make_unique<SegmentArena>(real_driver(), 0));
  cudaStream_t old_stream, new_stream;
  CUDA_OK(cudaStreamCreateWithFlags(&old_stream, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&new_stream, cudaStreamNonBlocking));
  const std::size_t bytes = 64 * kMiB, count = bytes / sizeof(int);
  auto* words = static_cast<int*>(a.allocate(bytes, reinterpret_cast<CUstream>(old_stream)));
  late_fill<<<8, 256, 0, old_stream>>>(words, count, 7, 200'000'000);  // 0.2 s, then writes 7
  CUDA_OK(cudaGetLastError());
  a.deallocate(words, reinterpret_cast<CUstream>(old_stream));
  auto* taken = static_cast<int*>(a.allocate(bytes, reinterpret_cast<CUstream>(new_stream)));
  ASSERT_EQ(taken, words) << "the idle segment was not taken: nothing is tested";
  EXPECT_EQ(a.stats().segment_stream_moves, 1u);
  late_fill<<<8, 256, 0, new_stream>>>(taken, count, 9, 0);  // the new owner's data, at once
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<int> host(count);
  CUDA_OK(cudaMemcpy(host.data(), taken, bytes, cudaMemcpyDeviceToHost));
  std::size_t overwritten = 0;
  for (int w : host) overwritten += (w != 9);
  EXPECT_EQ(overwritten, 0u) << "the old stream's late write landed after the new owner's";
  a.deallocate(taken, reinterpret_cast<CUstream>(new_stream));
  CUDA_OK(cudaStreamDestroy(old_stream));
  CUDA_OK(cudaStreamDestroy(new_stream));
}

}  // namespace symmpool::test
