// Allocator benchmarks, each against the usual alternative in the same run:
//   AllocFree/<impl>/<bytes>   hot alloc+free pair from a warm cache:
//                              symmpool, cudaMallocAsync, torch (caching allocator)
//   NewSegment/<impl>/<bytes>  a fresh segment usable by NCCL: symmpool
//                              (cuMemCreate + map + ncclCommRegister) against
//                              ncclMemAlloc + ncclCommRegister

#include "bench_checks.hpp"
#include "bench_context.hpp"

#include <symmpool/device_allocators.hpp>
#include <symmpool/nccl_registration.hpp>

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#ifdef SYMMPOOL_BENCH_WITH_TORCH
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

cudaStream_t bench_stream() {
  static cudaStream_t s = [] {
    cudaStream_t t;
    BENCH_CUDA(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    return t;
  }();
  return s;
}

// A communicator over every visible GPU, built in this process; we register
// with rank 0's, as a training process would with its own.
ncclComm_t bench_comm() {
  static ncclComm_t comm = [] {
    int n = 0;
    BENCH_CUDA(cudaGetDeviceCount(&n));
    std::vector<ncclComm_t> comms(static_cast<std::size_t>(n));
    std::vector<int> devs(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) devs[static_cast<std::size_t>(i)] = i;
    BENCH_NCCL(ncclCommInitAll(comms.data(), n, devs.data()));
    BENCH_CUDA(cudaSetDevice(0));
    return comms[0];
  }();
  return comm;
}

void set_bytes(benchmark::State& state, std::size_t bytes) {
  state.counters["bytes"] = static_cast<double>(bytes);
}

void AllocFreeSymmpool(benchmark::State& state, std::size_t bytes) {
  auto& alloc = symmpool::device_allocator(0);
  auto s = reinterpret_cast<CUstream>(bench_stream());
  alloc.deallocate(alloc.allocate(bytes, s), s);  // warm the cache
  for (auto _ : state) {
    void* p = alloc.allocate(bytes, s);
    benchmark::DoNotOptimize(p);
    alloc.deallocate(p, s);
  }
  set_bytes(state, bytes);
}

void AllocFreeCudaMallocAsync(benchmark::State& state, std::size_t bytes) {
  cudaMemPool_t pool;
  BENCH_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  std::uint64_t keep = UINT64_MAX;  // keep freed memory cached, like the others
  BENCH_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  void* p = nullptr;
  BENCH_CUDA(cudaMallocAsync(&p, bytes, bench_stream()));
  BENCH_CUDA(cudaFreeAsync(p, bench_stream()));
  for (auto _ : state) {
    BENCH_CUDA(cudaMallocAsync(&p, bytes, bench_stream()));
    benchmark::DoNotOptimize(p);
    BENCH_CUDA(cudaFreeAsync(p, bench_stream()));
  }
  BENCH_CUDA(cudaStreamSynchronize(bench_stream()));
  set_bytes(state, bytes);
}

#ifdef SYMMPOOL_BENCH_WITH_TORCH
void AllocFreeTorch(benchmark::State& state, std::size_t bytes) {
  namespace cca = c10::cuda::CUDACachingAllocator;
  static bool initialized = [] {
    int n = 0;
    BENCH_CUDA(cudaGetDeviceCount(&n));
    cca::init(n);
    return true;
  }();
  (void)initialized;
  cca::raw_delete(cca::raw_alloc_with_stream(bytes, bench_stream()));
  for (auto _ : state) {
    void* p = cca::raw_alloc_with_stream(bytes, bench_stream());
    benchmark::DoNotOptimize(p);
    cca::raw_delete(p);
  }
  set_bytes(state, bytes);
}
#endif

// One fresh segment per iteration; teardown (free, empty_cache) untimed.
void NewSegmentSymmpool(benchmark::State& state, std::size_t bytes) {
  auto& alloc = symmpool::device_allocator(0);
  symmpool::NcclRegistrationHook hook(bench_comm());
  alloc.add_observer(&hook, true);
  auto s = reinterpret_cast<CUstream>(bench_stream());
  alloc.empty_cache();
  for (auto _ : state) {
    void* p = alloc.allocate(bytes, s);
    benchmark::DoNotOptimize(p);
    state.PauseTiming();
    alloc.deallocate(p, s);
    alloc.empty_cache();
    state.ResumeTiming();
  }
  state.counters["registrations"] = static_cast<double>(hook.counts().registrations);
  alloc.remove_observer(&hook, true);
  set_bytes(state, bytes);
}

void NewSegmentNcclMemAlloc(benchmark::State& state, std::size_t bytes) {
  ncclComm_t comm = bench_comm();
  for (auto _ : state) {
    void* p = nullptr;
    void* handle = nullptr;
    BENCH_NCCL(ncclMemAlloc(&p, bytes));
    BENCH_NCCL(ncclCommRegister(comm, p, bytes, &handle));
    state.PauseTiming();
    BENCH_NCCL(ncclCommDeregister(comm, handle));
    BENCH_NCCL(ncclMemFree(p));
    state.ResumeTiming();
  }
  set_bytes(state, bytes);
}

std::string size_name(std::size_t bytes) {
  if (bytes >= GiB) return std::to_string(bytes / GiB) + "GiB";
  if (bytes >= MiB) return std::to_string(bytes / MiB) + "MiB";
  return std::to_string(bytes / KiB) + "KiB";
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  symmpool::bench::require_clean_tree("symmpool_alloc_bench");
  if (!symmpool::bench::add_gpu_context()) {
    std::fprintf(stderr, "symmpool_alloc_bench: no CUDA GPU visible, nothing to measure\n");
    return 0;
  }
  BENCH_CUDA(cudaSetDevice(0));
  for (std::size_t bytes = 4 * KiB; bytes <= 256 * MiB; bytes *= 4) {
    const std::string n = size_name(bytes);
    benchmark::RegisterBenchmark(("AllocFree/symmpool/" + n).c_str(), AllocFreeSymmpool, bytes);
    benchmark::RegisterBenchmark(("AllocFree/cudaMallocAsync/" + n).c_str(), AllocFreeCudaMallocAsync, bytes);
#ifdef SYMMPOOL_BENCH_WITH_TORCH
    benchmark::RegisterBenchmark(("AllocFree/torch/" + n).c_str(), AllocFreeTorch, bytes);
#endif
  }
  for (std::size_t bytes : {64 * MiB, 1 * GiB}) {
    const std::string n = size_name(bytes);
    benchmark::RegisterBenchmark(("NewSegment/symmpool/" + n).c_str(), NewSegmentSymmpool, bytes)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(10);
    benchmark::RegisterBenchmark(("NewSegment/ncclMemAlloc/" + n).c_str(), NewSegmentNcclMemAlloc, bytes)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(10);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
