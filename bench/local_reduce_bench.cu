// The reduction kernel on local memory only, as the two-step algorithms run
// it between their copies (collectives/src/two_step.cpp): `inputs` bf16
// buffers of `bytes` summed into one, one GPU, no peer. Counter hbm_GBps:
// bytes read and written per second, by grid cap (SYMMPOOL_MAX_BLOCKS).
//
//   build/bench/symmpool_local_reduce_bench --benchmark_out=<json> --benchmark_out_format=json

#include "bench_context.hpp"
#include "kernels.hpp"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
  std::exit(1);
}

// args: inputs, MiB per buffer, grid cap
void LocalReduce(benchmark::State& state) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    state.SkipWithError("no CUDA GPU");
    return;
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  const int inputs = static_cast<int>(state.range(0));
  const std::size_t bytes = static_cast<std::size_t>(state.range(1)) << 20;
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<void*> buffers(static_cast<std::size_t>(inputs) + 1);
  for (void*& b : buffers) {
    check(cudaMalloc(&b, bytes), "cudaMalloc");
    check(cudaMemset(b, 0x3c, bytes), "cudaMemset");  // bf16 ~0.0115: finite sums
  }
  symmpool::detail::ReduceLaunch launch;
  for (int p = 0; p < inputs; ++p) launch.in.ptr[p] = buffers[static_cast<std::size_t>(p)];
  launch.out.ptr[0] = buffers.back();
  launch.count = launch.grid_count = bytes / 2;
  launch.world = inputs;
  launch.type = symmpool::DataType::kBFloat16;
  launch.max_blocks = static_cast<int>(state.range(2));
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  constexpr int reps = 20;
  for (int i = 0; i < 3; ++i) check(symmpool::detail::launch_reduce(launch, stream), "launch_reduce");
  double seconds = 0;
  for (auto _ : state) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int i = 0; i < reps; ++i) check(symmpool::detail::launch_reduce(launch, stream), "launch_reduce");
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    state.SetIterationTime(ms / 1e3 / reps);
    seconds += ms / 1e3 / reps;
  }
  const double per_call = seconds / static_cast<double>(state.iterations());
  state.counters["hbm_GBps"] = static_cast<double>(bytes) * (inputs + 1) / per_call / 1e9;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  for (void* b : buffers) cudaFree(b);
  cudaStreamDestroy(stream);
}

}  // namespace

BENCHMARK(LocalReduce)
    ->ArgNames({"inputs", "MiB", "max_blocks"})
    ->ArgsProduct({{2, 8}, {8, 64}, {64, 132, 264}})
    ->UseManualTime()
    ->Iterations(20)
    ->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  return symmpool::bench::run_benchmarks(argc, argv, "symmpool_local_reduce_bench");
}
