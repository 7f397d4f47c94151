#pragma once
// SYMMPOOL_CUDA_TRY: a CUDA runtime call that throws symmpool::cuda_error
// with the call and the runtime's error string (code() then holds the
// cudaError_t value).

#include <symmpool/error.hpp>

#include <cuda_runtime_api.h>

#define SYMMPOOL_CUDA_TRY(call)                                                                \
  do {                                                                                         \
    cudaError_t symmpool_rt_status_ = (call);                                                  \
    if (symmpool_rt_status_ != cudaSuccess)                                                    \
      ::symmpool::detail::throw_cuda_error(__FILE__, __LINE__, #call,                          \
                                           static_cast<CUresult>(symmpool_rt_status_),         \
                                           cudaGetErrorString(symmpool_rt_status_));           \
  } while (0)
