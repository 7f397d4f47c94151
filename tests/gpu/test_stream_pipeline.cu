// The two-step algorithms' stream pipeline on one GPU, with stages made
// slow on purpose: a reduce sees its own piece's pull (never an older one,
// never the next piece's that reuses the slot), a push sees its reduce, and
// the caller's stream goes on only after every push; the same inside a CUDA
// graph; a stage that throws leaves no stream forked.

#include "gpu_skip.hpp"
#include "stream_pipeline.hpp"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <vector>

namespace symmpool::test {

namespace {

__device__ void pause_for(long long ns) {
  for (long long waited = 0; waited < ns; waited += 1000) __nanosleep(1000);
}

// *dst = *src * scale + add (src may be null: 0), after a pause.
__global__ void slow_store(int* dst, const int* src, int scale, int add, long long pause_ns) {
  pause_for(pause_ns);
  *dst = (src ? *src : 0) * scale + add;
}

constexpr int kPieces = 7;

struct Pauses {
  long long pull_ns, reduce_ns, push_ns;
};

// Device memory of one run: a staging word per slot, a reduced and a pushed
// word per piece, and what the caller's stream read after run().
struct Words {
  int* staging;   // [kMaxSlots]
  int* reduced;   // [kPieces]
  int* pushed;    // [kPieces]
  int* observed;  // [kPieces]: pushed, read on the caller's stream after run()
  Words() {
    EXPECT_EQ(cudaMalloc(&staging, detail::StreamPipeline::kMaxSlots * sizeof(int)), cudaSuccess);
    for (int** p : {&reduced, &pushed, &observed})
      EXPECT_EQ(cudaMalloc(p, kPieces * sizeof(int)), cudaSuccess);
  }
  ~Words() {
    for (int* p : {staging, reduced, pushed, observed}) cudaFree(p);
  }
  void poison(cudaStream_t s) {
    CUDA_OK(cudaMemsetAsync(staging, 0xff, detail::StreamPipeline::kMaxSlots * sizeof(int), s));
    for (int* p : {reduced, pushed, observed}) CUDA_OK(cudaMemsetAsync(p, 0xff, kPieces * sizeof(int), s));
  }
};

// Pull k writes k + 1 into its slot, reduce k copies the slot, push k
// writes 10x that; then the caller's stream copies every pushed word.
void enqueue(detail::StreamPipeline& pipeline, Words& w, int slots, bool with_push, Pauses pauses,
             cudaStream_t stream, int throw_at_pull = -1) {
  auto pull = [&](int k, int slot, cudaStream_t s) {
    if (k == throw_at_pull) throw std::runtime_error("pull failed");
    slow_store<<<1, 1, 0, s>>>(w.staging + slot, nullptr, 0, k + 1, pauses.pull_ns);
    CUDA_OK(cudaGetLastError());
  };
  auto reduce = [&](int k, int slot, cudaStream_t s) {
    slow_store<<<1, 1, 0, s>>>(w.reduced + k, w.staging + slot, 1, 0, pauses.reduce_ns);
    CUDA_OK(cudaGetLastError());
  };
  auto push = [&](int k, int, cudaStream_t s) {
    slow_store<<<1, 1, 0, s>>>(w.pushed + k, w.reduced + k, 10, 0, pauses.push_ns);
    CUDA_OK(cudaGetLastError());
  };
  pipeline.run(kPieces, slots, stream, pull, reduce,
               with_push ? detail::StreamPipeline::Stage(push) : detail::StreamPipeline::Stage());
  for (int k = 0; k < kPieces; ++k) slow_store<<<1, 1, 0, stream>>>(w.observed + k, w.pushed + k, 1, 0, 0);
  CUDA_OK(cudaGetLastError());
}

void expect_results(Words& w, bool with_push, cudaStream_t s, const char* what) {
  std::vector<int> reduced(kPieces), observed(kPieces);
  CUDA_OK(cudaMemcpyAsync(reduced.data(), w.reduced, kPieces * sizeof(int), cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaMemcpyAsync(observed.data(), w.observed, kPieces * sizeof(int), cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  for (int k = 0; k < kPieces; ++k) {
    EXPECT_EQ(reduced[k], k + 1) << what << ": piece " << k << " reduced another piece's pull";
    if (with_push)
      EXPECT_EQ(observed[k], 10 * (k + 1)) << what << ": piece " << k << "'s push not seen after run()";
  }
}

}  // namespace

TEST(StreamPipeline, EachStageSeesItsOwnPieceWhicheverStageIsSlow) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  CUDA_OK(cudaSetDevice(0));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  detail::StreamPipeline pipeline;
  Words w;
  const Pauses cases[] = {{0, 20000, 0}, {30000, 0, 0}, {0, 0, 30000}};
  for (const Pauses& p : cases) {
    for (int slots = 1; slots <= 3; ++slots) {
      for (bool with_push : {true, false}) {
        w.poison(s);
        enqueue(pipeline, w, slots, with_push, p, s);
        expect_results(w, with_push, s, "eager");
      }
    }
  }
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(StreamPipeline, ACapturedPipelineReplaysInOrder) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  CUDA_OK(cudaSetDevice(0));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  detail::StreamPipeline pipeline;
  Words w;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  enqueue(pipeline, w, 2, true, {0, 20000, 20000}, s);
  CUDA_OK(cudaStreamEndCapture(s, &graph));  // fails (unjoined) if a side stream was left forked
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    w.poison(s);
    CUDA_OK(cudaGraphLaunch(exec, s));
    expect_results(w, true, s, "graph replay");
    // An eager run between replays, on the same pipeline now that the
    // capture has ended (the communicator keeps a second one for eager
    // calls made while a capture is open: EagerAndCaptured).
    w.poison(s);
    enqueue(pipeline, w, 3, true, {20000, 0, 0}, s);
    expect_results(w, true, s, "eager between replays");
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(StreamPipeline, AStageThatThrowsLeavesNothingForked) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  CUDA_OK(cudaSetDevice(0));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  detail::StreamPipeline pipeline;
  Words w;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  EXPECT_THROW(enqueue(pipeline, w, 2, true, {0, 0, 0}, s, /*throw_at_pull=*/3), std::runtime_error);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess) << "a side stream was left in the capture";
  if (graph) CUDA_OK(cudaGraphDestroy(graph));
  // Eager too: the pipeline is still usable afterwards.
  EXPECT_THROW(enqueue(pipeline, w, 2, true, {0, 0, 0}, s, /*throw_at_pull=*/1), std::runtime_error);
  w.poison(s);
  enqueue(pipeline, w, 2, true, {0, 20000, 0}, s);
  expect_results(w, true, s, "after a failed run");
  CUDA_OK(cudaStreamDestroy(s));
}

}  // namespace symmpool::test
