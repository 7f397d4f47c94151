#pragma once
// Bench programs stop at the first failed CUDA, NCCL or cuBLAS call, naming it.

#include <cstdio>
#include <cstdlib>

#define BENCH_CHECK(call, ok)                                                \
  do {                                                                       \
    auto r_ = (call);                                                        \
    if (r_ != (ok)) {                                                        \
      std::fprintf(stderr, "%s failed (%d)\n", #call, static_cast<int>(r_)); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

#define BENCH_CUDA(call)                                                      \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

#define BENCH_NCCL(call)                                                      \
  do {                                                                        \
    ncclResult_t r_ = (call);                                                 \
    if (r_ != ncclSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, ncclGetErrorString(r_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)
