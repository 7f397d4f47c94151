// The failure monitor retires finished collectives' events on its own
// thread, and on the caller's when many are in flight; an eager call may
// come from the thread of an open capture in global mode (torch.cuda.graph's
// default), where cudaEventQuery is refused and would invalidate the
// capture. It names the oldest call the GPU has not finished, and queries
// few events to find it.

#include "call_end_word.hpp"
#include "event_pool.hpp"
#include "failure_monitor.hpp"
#include "gpu_skip.hpp"
#include "held_stream.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace symmpool::test {

namespace {

// A monitor of rank 0 of 2 on GPU 0, and the events its calls end at.
class FailureMonitorOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    SYMMPOOL_SKIP_WITHOUT_GPUS(1);
    CUDA_OK(cudaSetDevice(0));
    monitor_ = std::make_unique<detail::FailureMonitor>(0, 0, 2, std::chrono::seconds(5), &words_,
                                                        detail::FailureMonitor::Handler{});
  }
  detail::FailureMonitor& monitor() { return *monitor_; }
  std::shared_ptr<detail::EventPool> pool = detail::EventPool::make();

 private:
  detail::ErrorWords words_{};
  std::unique_ptr<detail::FailureMonitor> monitor_;
};

}  // namespace

TEST_F(FailureMonitorOnGpu, RecordingEagerCallsLeavesAGlobalCaptureValid) {
  cudaStream_t eager, captured;
  CUDA_OK(cudaStreamCreateWithFlags(&eager, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&captured, cudaStreamNonBlocking));
  void* buffer = nullptr;
  CUDA_OK(cudaMalloc(&buffer, 4096));
  CUDA_OK(cudaStreamBeginCapture(captured, cudaStreamCaptureModeGlobal));
  CUDA_OK(cudaMemsetAsync(buffer, 0, 4096, captured));
  // Time for the monitor's thread to retire finished ones at its polls,
  // then enough for the caller's thread to retire twice (every 1024 in
  // flight) once the monitor's no longer does.
  for (int call = 0; call < 100; ++call)
    monitor().record("all_gather", 4096, pool->record(eager), /*captured=*/false);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  monitor().retire_on_callers_thread_only_for_testing();
  for (int call = 0; call < 2100; ++call)
    monitor().record("all_gather", 4096, pool->record(eager), /*captured=*/false);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(captured, &graph), cudaSuccess) << "the eager calls invalidated the capture";
  (void)cudaGetLastError();
  if (graph) CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamSynchronize(eager));
  CUDA_OK(cudaFree(buffer));
  CUDA_OK(cudaStreamDestroy(captured));
  CUDA_OK(cudaStreamDestroy(eager));
}

TEST_F(FailureMonitorOnGpu, NamesTheOldestUnfinishedCallBehindFinishedOnesOfBothKinds) {
  cudaStream_t ready;
  CUDA_OK(cudaStreamCreateWithFlags(&ready, cudaStreamNonBlocking));
  {
    HeldStream waits, later;
    for (int call = 1; call <= 5; ++call) monitor().record("all_gather", 4096, pool->record(ready), false);
    // Point-to-point calls are outside the collectives' order: one still
    // waiting may sit before collectives that finished.
    monitor().record_point_to_point("wait", 1, pool->record(waits.get()), false);
    for (int call = 6; call <= 40; ++call) monitor().record("all_gather", 4096, pool->record(ready), false);
    CUDA_OK(cudaStreamSynchronize(ready));
    // Later collectives wait for the earlier ones (IssueOrder), as they do
    // on the held stream.
    for (int call = 41; call <= 45; ++call)
      monitor().record("reduce_scatter", 8192, pool->record(later.get()), false);
    EXPECT_EQ(monitor().describe_unfinished(), "wait #1 from rank 1 (45 collectives issued)");
    waits.release();
    CUDA_OK(cudaStreamSynchronize(waits.get()));
    EXPECT_EQ(monitor().describe_unfinished(), "reduce_scatter #41 (8192 bytes; 45 collectives issued)");
    later.release();
    CUDA_OK(cudaStreamSynchronize(later.get()));
  }
  EXPECT_EQ(monitor().describe_unfinished().rfind("a collective (none issued eagerly is unfinished", 0), 0u)
      << monitor().describe_unfinished();
  CUDA_OK(cudaStreamDestroy(ready));
}

// Each cudaEventQuery took about 2 us of an eager call's host time: with
// the GPU keeping up, the newest finished collective vouches for the
// others (one query per retire, not one per call).
TEST_F(FailureMonitorOnGpu, RetiringFinishedCollectivesQueriesFewEvents) {
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  monitor().retire_on_callers_thread_only_for_testing();
  constexpr int kCalls = 2500;  // the caller's thread retires twice
  for (int call = 0; call < kCalls; ++call) {
    monitor().record("all_reduce", 8192, pool->record(stream), false);
    CUDA_OK(cudaStreamSynchronize(stream));
  }
  EXPECT_LE(monitor().event_queries(), static_cast<std::uint64_t>(kCalls / 10))
      << "queried about one event per call";
  EXPECT_GT(monitor().event_queries(), 0u);
  CUDA_OK(cudaStreamDestroy(stream));
}

// With the GPU behind every call (a stalled peer), each retire takes two
// queries (the newest, the oldest), not a probe for every power of two.
TEST_F(FailureMonitorOnGpu, CollectivesTheGpuHasNotReachedCostTwoQueriesARetire) {
  monitor().retire_on_callers_thread_only_for_testing();
  constexpr int kCalls = 4000;  // fewer than the 4096 entries kept
  {
    HeldStream held;
    for (int call = 0; call < kCalls; ++call)
      monitor().record("all_reduce", 8192, pool->record(held.get()), false);
    EXPECT_EQ(monitor().describe_unfinished(), "all_reduce #1 (8192 bytes; 4000 collectives issued)");
    const std::uint64_t retires = kCalls / 1024 + 1;  // every 1024 records, and describe_unfinished's
    EXPECT_LE(monitor().event_queries(), 2 * retires);
  }
  EXPECT_EQ(monitor().describe_unfinished().rfind("a collective (none issued eagerly is unfinished", 0), 0u)
      << monitor().describe_unfinished();
}

// Finished calls go back to the pool without another call recorded: the
// monitor's thread retires them (before, the caller's thread did, every 32
// records, on the eager call's host time).
TEST_F(FailureMonitorOnGpu, TheMonitorsThreadRetiresFinishedCalls) {
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr std::size_t kCalls = 10;
  {
    // Held here until all are recorded: a poll meanwhile must not give one
    // back for the next record to reuse (then fewer than kCalls exist).
    std::vector<detail::SharedEvent> held;
    for (std::size_t call = 0; call < kCalls; ++call) {
      held.push_back(pool->record(stream));
      monitor().record("all_reduce", 8192, held.back(), false);
    }
    CUDA_OK(cudaStreamSynchronize(stream));
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (pool->spare() < kCalls && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(pool->spare(), kCalls) << "finished calls still held their events";
  CUDA_OK(cudaStreamDestroy(stream));
}

// Calls whose kernel reports its own end (an eager low-latency all-reduce)
// record no event: they are finished once the end word reaches their
// number, and the oldest one it has not reached is the one named.
TEST_F(FailureMonitorOnGpu, CallsEndingAtTheWordFinishWhenItReachesThem) {
  auto word = detail::CallEndWord::make_if_supported(0);
  if (!word) GTEST_SKIP() << "GPU 0 takes no 64-bit stream memops";
  detail::ErrorWords words{};
  detail::FailureMonitor monitor(0, 0, 2, std::chrono::seconds(5), &words, detail::FailureMonitor::Handler{},
                                 word.get());
  for (std::uint64_t call = 1; call <= 5; ++call) monitor.record_ending_at_word("all_reduce", 8192, call);
  EXPECT_EQ(monitor.describe_unfinished(), "all_reduce #1 (8192 bytes; 5 collectives issued)");
  __atomic_store_n(word->for_kernel(), std::uint64_t{3}, __ATOMIC_RELEASE);  // as the kernel of call 3 does
  EXPECT_EQ(monitor.describe_unfinished(), "all_reduce #4 (8192 bytes; 5 collectives issued)");
  __atomic_store_n(word->for_kernel(), std::uint64_t{5}, __ATOMIC_RELEASE);
  EXPECT_EQ(monitor.describe_unfinished().rfind("a collective (none issued eagerly is unfinished", 0), 0u)
      << monitor.describe_unfinished();
  EXPECT_EQ(monitor.event_queries(), 0u) << "no event to query";
}

// Another stream waits for such a call with a stream memop on the word.
TEST_F(FailureMonitorOnGpu, AStreamWaitsForTheEndWord) {
  auto word = detail::CallEndWord::make_if_supported(0);
  if (!word) GTEST_SKIP() << "GPU 0 takes no 64-bit stream memops";
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  word->make_wait(stream, 7);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "passed before the word reached 7";
  __atomic_store_n(word->for_kernel(), std::uint64_t{7}, __ATOMIC_RELEASE);
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaStreamDestroy(stream));
}

}  // namespace symmpool::test
