// The caching allocator on a real GPU: real cuMem segments, data through
// them, statistics, empty_cache and the errors that only a device can show.

#include "gpu_skip.hpp"
#include "held_stream.hpp"

#include <symmpool/caching_allocator.hpp>
#include <symmpool/device_allocators.hpp>
#include <symmpool/error.hpp>

#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

namespace symmpool::test {

constexpr std::size_t MiB = 1 << 20;

std::unique_ptr<CachingAllocator> real_allocator(int device) {
  return std::make_unique<CachingAllocator>(std::make_unique<SegmentArena>(real_driver(), device));
}

TEST(RealAllocator, DataRoundTripsThroughSegmentsOfManySizes) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  CUDA_OK(cudaSetDevice(0));
  auto a = real_allocator(0);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  std::mt19937 rng(7);
  for (std::size_t bytes :
       {std::size_t{1}, std::size_t{511}, std::size_t{4097}, MiB + 3, 13 * MiB + 5, 300 * MiB + 1}) {
    std::vector<unsigned char> in(bytes), out(bytes, 0);
    for (auto& b : in) b = static_cast<unsigned char>(rng());
    void* p = a->allocate(bytes, reinterpret_cast<CUstream>(s));
    ASSERT_NE(p, nullptr);
    CUDA_OK(cudaMemsetAsync(p, 0xff, bytes, s));  // poison first
    CUDA_OK(cudaMemcpyAsync(p, in.data(), bytes, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemcpyAsync(out.data(), p, bytes, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_EQ(std::memcmp(in.data(), out.data(), bytes), 0) << bytes << " bytes";
    a->deallocate(p, reinterpret_cast<CUstream>(s));
  }
  auto st = a->stats();
  EXPECT_EQ(st.allocated_bytes.current, 0);
  EXPECT_GE(st.reserved_bytes.peak, static_cast<std::int64_t>(300 * MiB));
  EXPECT_FALSE(a->multicast().enabled) << "multicast must stay off here: " << a->multicast().reason;
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(RealAllocator, EmptyCacheGivesMemoryBackToTheDevice) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  CUDA_OK(cudaSetDevice(0));
  auto a = real_allocator(0);
  std::size_t free_before = 0, free_mid = 0, free_after = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_before, &total));
  void* p = a->allocate(1024 * MiB, nullptr);
  a->deallocate(p, nullptr);
  CUDA_OK(cudaMemGetInfo(&free_mid, &total));
  EXPECT_LE(free_mid + 1000 * MiB, free_before) << "the cache should still hold 1 GiB";
  EXPECT_EQ(a->empty_cache(), 1024 * MiB);
  CUDA_OK(cudaMemGetInfo(&free_after, &total));
  EXPECT_GE(free_after + 64 * MiB, free_before);
}

TEST(RealAllocator, OutOfMemoryNamesSizesAndLeavesAWorkingAllocator) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  CUDA_OK(cudaSetDevice(0));
  auto a = real_allocator(0);
  std::size_t free_bytes = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_bytes, &total));
  void* held = a->allocate(free_bytes / 2, nullptr);
  try {
    a->allocate(free_bytes * 3 / 4, nullptr);
    FAIL() << "expected out_of_memory";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory on device 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("free of"), std::string::npos) << e.what();
  }
  a->deallocate(held, nullptr);
  void* p = a->allocate(64 * MiB, nullptr);
  EXPECT_NE(p, nullptr);
  a->deallocate(p, nullptr);
}

TEST(RealAllocator, RecordStreamWaitsForTheOtherStream) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  CUDA_OK(cudaSetDevice(0));
  auto a = real_allocator(0);
  cudaStream_t s1;
  CUDA_OK(cudaStreamCreate(&s1));
  // Stream 2 is held until release(): its writes to p below cannot finish
  // before then, however fast the GPU, so "still busy" is not a race.
  // Declared after the allocator: destroyed (released, synchronized) first.
  HeldStream held;
  cudaStream_t s2 = held.get();
  auto* p = a->allocate(64 * MiB, reinterpret_cast<CUstream>(s1));
  // s2 writes p, then p is freed on s1: the block must not be handed out
  // again until s2's work is done.
  for (int i = 0; i < 4; ++i) CUDA_OK(cudaMemsetAsync(p, i, 64 * MiB, s2));
  a->record_stream(p, reinterpret_cast<CUstream>(s2));
  a->deallocate(p, reinterpret_cast<CUstream>(s1));
  ASSERT_EQ(cudaStreamQuery(s2), cudaErrorNotReady) << "stream 2 must still be held here";
  void* q = a->allocate(64 * MiB, reinterpret_cast<CUstream>(s1));
  EXPECT_NE(q, p) << "reused while stream 2 was still writing";
  // Once s2 is done, p's block is free again: the next request of its size
  // on s1 (q still held) gets it from the cache.
  held.release();
  CUDA_OK(cudaStreamSynchronize(s2));
  void* r = a->allocate(64 * MiB, reinterpret_cast<CUstream>(s1));
  EXPECT_EQ(r, p) << "not handed out again after stream 2 finished";
  a->deallocate(r, reinterpret_cast<CUstream>(s1));
  a->deallocate(q, reinterpret_cast<CUstream>(s1));
  CUDA_OK(cudaStreamSynchronize(s1));
  CUDA_OK(cudaStreamDestroy(s1));
}

TEST(RealAllocator, FreeOnTheWrongDeviceIsRejected) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(2);
  void* p = device_allocator(0).allocate(4096, nullptr);
  try {
    free_on_device(p, 4096, 1, nullptr);
    FAIL() << "expected logic_error";
  } catch (const logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("belongs to device 0"), std::string::npos) << e.what();
  }
  free_on_device(p, 4096, 0, nullptr);
  EXPECT_EQ(device_allocator(0).stats().active_blocks.current, 0);
}

TEST(RealAllocator, SegmentsAreExportableFileDescriptorMemory) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  auto a = real_allocator(0);
  void* p = a->allocate(4096, nullptr);
  auto segs = a->segments();
  ASSERT_EQ(segs.size(), 1u);
  int fd = -1;
  ASSERT_EQ(real_driver().cuMemExportToShareableHandle(&fd, segs[0].handle,
                                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_SUCCESS);
  EXPECT_GE(fd, 0);
  close(fd);
  EXPECT_EQ(segs[0].size % a->granularity(), 0u);
  a->deallocate(p, nullptr);
}

}  // namespace symmpool::test
