#pragma once
// Shared by GPU tests: a stream held by a host function until release().
// Work queued on it after the hold waits, however fast the GPU is, so a
// test can check what must hold while a stream is still busy without
// racing the GPU.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace symmpool::test {

// Events recorded on the stream, and work queued on it, stay unfinished
// until release(); the destructor releases it and waits for the stream.
class HeldStream {
 public:
  HeldStream() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaLaunchHostFunc(
                  stream_,
                  [](void* gate) {
                    while (!static_cast<std::atomic<bool>*>(gate)->load()) std::this_thread::yield();
                  },
                  &released_),
              cudaSuccess);
  }
  ~HeldStream() {
    release();
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  HeldStream(const HeldStream&) = delete;
  HeldStream& operator=(const HeldStream&) = delete;
  void release() { released_ = true; }
  cudaStream_t get() const { return stream_; }

 private:
  std::atomic<bool> released_{false};
  cudaStream_t stream_ = nullptr;
};

}  // namespace symmpool::test
