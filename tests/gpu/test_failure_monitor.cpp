// The failure monitor retires finished collectives' events as eager calls
// are recorded; an eager call may come from the thread of an open capture
// in global mode (torch.cuda.graph's default), where cudaEventQuery is
// refused and would invalidate the capture.

#include "event_pool.hpp"
#include "failure_monitor.hpp"
#include "gpu_skip.hpp"

#include <cuda_runtime_api.h>

#include <chrono>

namespace symmpool::test {

TEST(FailureMonitor, RecordingEagerCallsLeavesAGlobalCaptureValid) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  CUDA_OK(cudaSetDevice(0));
  detail::ErrorWords words{};
  detail::FailureMonitor monitor(0, 0, 2, std::chrono::seconds(5), &words, {});
  auto pool = detail::EventPool::make();
  cudaStream_t eager, captured;
  CUDA_OK(cudaStreamCreateWithFlags(&eager, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&captured, cudaStreamNonBlocking));
  void* buffer = nullptr;
  CUDA_OK(cudaMalloc(&buffer, 4096));
  CUDA_OK(cudaStreamBeginCapture(captured, cudaStreamCaptureModeGlobal));
  CUDA_OK(cudaMemsetAsync(buffer, 0, 4096, captured));
  for (int call = 0; call < 100; ++call)  // enough to retire finished ones several times
    monitor.record("all_gather", 4096, pool->record(eager), /*captured=*/false);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(captured, &graph), cudaSuccess) << "the eager calls invalidated the capture";
  (void)cudaGetLastError();
  if (graph) CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamSynchronize(eager));
  CUDA_OK(cudaFree(buffer));
  CUDA_OK(cudaStreamDestroy(captured));
  CUDA_OK(cudaStreamDestroy(eager));
}

}  // namespace symmpool::test
