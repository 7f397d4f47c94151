#pragma once
// Checks for code that runs inside one rank's child process, where gtest
// assertions do not reach the parent: print, then fail the rank. They expect
// `rank` (and, for RANK_EXPECT, an int `failures`) in scope, and are used in
// a function returning the rank's exit code (RANK_CUDA, RANK_NCCL and
// RANK_CHECK return 1).

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>

// A CUDA or NCCL call that must succeed: otherwise the rank returns 1.
#define RANK_CUDA(call)                                                                \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "[rank %d] %s: %s\n", rank, #call, cudaGetErrorString(e_)); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

#define RANK_NCCL(call)                                                                \
  do {                                                                                 \
    ncclResult_t r_ = (call);                                                          \
    if (r_ != ncclSuccess) {                                                           \
      std::fprintf(stderr, "[rank %d] %s: %s\n", rank, #call, ncclGetErrorString(r_)); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

// Prints where a rank's check of `cond` failed, then the printf-style message.
#define RANK_REPORT_FAILURE(cond_text, ...)                                                          \
  do {                                                                                               \
    std::fprintf(stderr, "[rank %d] %s:%d check failed: %s: ", rank, __FILE__, __LINE__, cond_text); \
    std::fprintf(stderr, __VA_ARGS__);                                                               \
    std::fprintf(stderr, "\n");                                                                      \
  } while (0)

// A result check that fails the rank at once (like ASSERT_*).
#define RANK_CHECK(cond, ...)                  \
  do {                                         \
    if (!(cond)) {                             \
      RANK_REPORT_FAILURE(#cond, __VA_ARGS__); \
      return 1;                                \
    }                                          \
  } while (0)

// A result check that counts a failure and goes on (like EXPECT_*).
#define RANK_EXPECT(cond, ...)                 \
  do {                                         \
    if (!(cond)) {                             \
      RANK_REPORT_FAILURE(#cond, __VA_ARGS__); \
      ++failures;                              \
    }                                          \
  } while (0)
