#pragma once
// Shared by GPU tests: skip, with a reason, when no usable GPU is present;
// check CUDA runtime calls.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>

namespace symmpool::test {

inline int visible_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

#define SYMMPOOL_SKIP_WITHOUT_GPUS(n)                                                 \
  do {                                                                                \
    int have_ = ::symmpool::test::visible_gpus();                                     \
    if (have_ < (n))                                                                  \
      GTEST_SKIP() << "needs " << (n) << " CUDA GPU(s), this machine has " << have_   \
                   << " (GPU tests run on the device machine: scripts/gpu_check.sh)"; \
  } while (0)

#define CUDA_OK(call)                                                      \
  do {                                                                     \
    cudaError_t e_ = (call);                                               \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_); \
  } while (0)

}  // namespace symmpool::test
