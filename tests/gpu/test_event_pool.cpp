// The pool of collectives' end events: one event per record, shared by its
// holders, reused only once none holds it (a Work that waits later must
// not find its event recorded again for a later collective).

#include "event_pool.hpp"
#include "gpu_skip.hpp"

#include <cuda_runtime_api.h>

namespace symmpool::test {

TEST(EventPool, AnEventStillHeldIsNeverHandedOutAgain) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  CUDA_OK(cudaSetDevice(0));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  auto pool = detail::EventPool::make();
  detail::SharedEvent held = pool->record(s);
  detail::SharedEvent copy = held;  // a second holder (the flight record, say)
  {
    detail::SharedEvent brief = pool->record(s);
    EXPECT_NE(brief.get(), held.get());
  }
  EXPECT_EQ(pool->spare(), 1u) << "an event nobody holds goes back to the pool";
  held.reset();
  EXPECT_EQ(pool->spare(), 1u) << "the event went back while a holder was left";
  detail::SharedEvent next = pool->record(s);
  EXPECT_NE(next.get(), copy.get()) << "an event still held was recorded again";
  EXPECT_EQ(pool->spare(), 0u);
  copy.reset();
  EXPECT_EQ(pool->spare(), 1u);
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(cudaEventQuery(next.get()), cudaSuccess);
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(EventPool, HandlesOutliveThePool) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  CUDA_OK(cudaSetDevice(0));
  detail::SharedEvent survivor;
  {
    auto pool = detail::EventPool::make();
    survivor = pool->record(nullptr);
  }  // as a Work outlives its communicator
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(cudaEventQuery(survivor.get()), cudaSuccess);
  survivor.reset();  // the pool goes with its last handle, its events destroyed
}

}  // namespace symmpool::test
