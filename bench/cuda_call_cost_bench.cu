// Host time of the CUDA runtime calls an eager collective makes, alone and
// in the patterns symmpool's eager path used and uses: what one more event
// record or stream wait costs once a kernel is queued (far more than on an
// idle stream). Results feed the host-cost budget of bench/host_time.py.
//
//   build/bench/symmpool_cuda_call_cost_bench --benchmark_out=<json> --benchmark_out_format=json

#include "bench_context.hpp"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace {

__global__ void empty_kernel(int* never) {
  if (never && threadIdx.x == 0) *never = 1;
}

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
  std::exit(1);
}

// A stream and two events on GPU 0; skips the benchmark where there is none.
struct Stream {
  cudaStream_t stream = nullptr;
  cudaEvent_t first = nullptr, second = nullptr;
  explicit Stream(benchmark::State& state) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      state.SkipWithError("no CUDA GPU");
      return;
    }
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&first, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&second, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~Stream() {
    if (!stream) return;
    cudaStreamSynchronize(stream);
    cudaEventDestroy(first);
    cudaEventDestroy(second);
    cudaStreamDestroy(stream);
  }
  void launch() const { empty_kernel<<<1, 32, 0, stream>>>(nullptr); }
};

// Per call: the loop's calls, synchronized every 256 so the queue stays short.
template <typename Call>
void run(benchmark::State& state, const Stream& s, Call call) {
  int since_sync = 0;
  for (auto _ : state) {
    call();
    if (++since_sync == 256) {
      state.PauseTiming();
      check(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize");
      since_sync = 0;
      state.ResumeTiming();
    }
  }
}

void BM_EventRecordIdleStream(benchmark::State& state) {
  Stream s(state);
  if (s.stream) run(state, s, [&] { cudaEventRecord(s.first, s.stream); });
}

void BM_KernelLaunch(benchmark::State& state) {
  Stream s(state);
  if (s.stream) run(state, s, [&] { s.launch(); });
}

// symmpool's eager call now: the collective's kernel, then one shared event.
void BM_LaunchThenOneRecord(benchmark::State& state) {
  Stream s(state);
  if (s.stream)
    run(state, s, [&] {
      s.launch();
      cudaEventRecord(s.first, s.stream);
    });
}

// Before: the issue order's, the flight record's and the Work's own events,
// then dist's wait() on the same stream.
void BM_LaunchThenThreeRecordsAndAWait(benchmark::State& state) {
  Stream s(state);
  if (s.stream)
    run(state, s, [&] {
      s.launch();
      cudaEventRecord(s.first, s.stream);
      cudaEventRecord(s.second, s.stream);
      cudaEventRecord(s.first, s.stream);
      cudaStreamWaitEvent(s.stream, s.first, 0);
    });
}

void BM_StreamGetCaptureInfo(benchmark::State& state) {
  Stream s(state);
  if (s.stream)
    run(state, s, [&] {
      cudaStreamCaptureStatus status;
      unsigned long long id;
      cudaStreamGetCaptureInfo(s.stream, &status, &id);
    });
}

}  // namespace

BENCHMARK(BM_EventRecordIdleStream);
BENCHMARK(BM_KernelLaunch);
BENCHMARK(BM_LaunchThenOneRecord);
BENCHMARK(BM_LaunchThenThreeRecordsAndAWait);
BENCHMARK(BM_StreamGetCaptureInfo);

int main(int argc, char** argv) {
  return symmpool::bench::run_benchmarks(argc, argv, "symmpool_cuda_call_cost_bench");
}
