// How symmpool's collectives fail when the group is broken: a peer that
// stops coming times out with an error naming it (and work queued behind
// drains), and ranks that share a GPU are refused when their heap forms.

#include "process_group.hpp"
#include "rank_checks.hpp"

#include <symmpool/communicator.hpp>
#include <symmpool/device_allocators.hpp>
#include <symmpool/error.hpp>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

namespace symmpool::test {

// Both barrier kinds give up on a peer that left, after
// SYMMPOOL_BARRIER_TIMEOUT: the kernel by itself, the stream-memop one
// (cuStreamWaitValue32 waits forever) through the communicator's watchdog.
// So does a fused kernel, which meets its peers at its start and its end:
// once its start gave up, its end does not wait a second timeout. Work
// queued behind the failed one drains without its own timeout.
TEST(Collectives, APeerThatStopsComingTimesOutWithAnError) {
  SYMMPOOL_GPUS_OR_SKIP(gpus, 2);
  shared_store_dir();
  constexpr int kTimeout = 10;
  ::setenv("SYMMPOOL_BARRIER_TIMEOUT", std::to_string(kTimeout).c_str(), 1);
  std::string result = run_ranks(2, 150, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    const int device = rank;
    RANK_CUDA(cudaSetDevice(device));
    FileStore store(shared_store_dir());
    CachingAllocator& alloc = device_allocator(device);
    SymmetricHeap heap(real_driver(), alloc, store, "dies", rank, world);
    Communicator comm(heap, alloc);
    cudaStream_t s;
    RANK_CUDA(cudaStreamCreate(&s));
    // While both ranks are here: a symmetric buffer that a fused all-gather
    // has already used, so what follows needs no heap exchange.
    constexpr std::size_t kBytes = 4096;
    auto* gathered = static_cast<char*>(alloc.allocate(kBytes * world, reinterpret_cast<CUstream>(s)));
    auto fused_all_gather = [&] {
      comm.all_gather(gathered + rank * kBytes, gathered, kBytes, s, Algorithm::kKernel);
    };
    fused_all_gather();
    RANK_CUDA(cudaStreamSynchronize(s));
    comm.check_errors();
    if (rank == 1) return 0;  // leaves after setting up
    struct Case {
      const char* name;
      std::function<void()> enqueue;
    };
    const Case cases[] = {
        {"kernel barrier", [&] { comm.barrier(s, BarrierKind::kKernel); }},
        {"stream-op barrier", [&] { comm.barrier(s, BarrierKind::kStreamOps); }},
        {"fused all-gather", fused_all_gather},
    };
    for (const Case& c : cases) {
      const auto start = std::chrono::steady_clock::now();
      for (int queued = 0; queued < 3; ++queued) c.enqueue();
      RANK_CUDA(cudaStreamSynchronize(s));  // the first gives up, the two behind it drain
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("[rank 0] 3 %s without their peer returned after %.1f s\n", c.name, waited);
      RANK_EXPECT(waited >= kTimeout - 1 && waited < 1.5 * kTimeout, "3 %s returned after %.1f s", c.name, waited);
      try {
        comm.check_errors();
        RANK_EXPECT(false, "a %s without its peer completed", c.name);
      } catch (const timeout_error& e) {
        RANK_EXPECT(std::strstr(e.what(), "for rank 1") && std::strstr(e.what(), "10 s"), "%s", e.what());
      }
    }
    return failures;
  });
  ::unsetenv("SYMMPOOL_BARRIER_TIMEOUT");
  EXPECT_EQ(result, "");
}

// Like NCCL, one GPU per rank: a group whose ranks share a GPU is refused
// when its heap forms, on every rank, naming the ranks and the GPU.
TEST(Collectives, TwoRanksOnOneGpuAreRefusedByName) {
  SYMMPOOL_GPUS_OR_SKIP(gpus, 1);
  shared_store_dir();
  std::string result = run_ranks(2, 120, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    RANK_CUDA(cudaSetDevice(0));
    FileStore store(shared_store_dir());
    try {
      SymmetricHeap heap(real_driver(), device_allocator(0), store, "crowded", rank, world);
      RANK_EXPECT(false, "two ranks on GPU 0 formed a heap");
    } catch (const logic_error& e) {
      std::printf("[rank %d] %s\n", rank, e.what());
      RANK_EXPECT(std::strstr(e.what(), "ranks 0 and 1 both use the GPU at PCI ") &&
                      std::strstr(e.what(), "symmpool needs one GPU per rank"),
                  "%s", e.what());
    }
    return failures;
  });
  EXPECT_EQ(result, "");
}

}  // namespace symmpool::test
