#pragma once
// The driver table: every CUDA driver call symmpool makes goes through these
// function pointers. The real table is filled from cudaGetDriverEntryPoint, so
// nothing links libcuda; tests swap in a fake table (symmpool/testing/fake_driver.hpp).

#include <cuda.h>

namespace symmpool {

// Every CUDA driver function symmpool calls, listed once (an X-macro): a user
// defines X(name) and expands SYMMPOOL_DRIVER_FUNCTIONS(X). DriverApi below
// declares the members, driver_api.cpp loads #name at CUDA_VERSION, and
// fake_driver.cpp sets each to its fake_##name. Adding a function is one line
// here plus its fake. `name` is cuda.h's unversioned name: where the headers
// map it to a versioned one (cuMemGetInfo -> cuMemGetInfo_v2) the member's
// name and type follow, and asking at CUDA_VERSION returns that same ABI.
#define SYMMPOOL_DRIVER_FUNCTIONS(X) \
  X(cuGetErrorString)                \
  X(cuDeviceGet)                     \
  X(cuDeviceGetCount)                \
  X(cuDeviceGetAttribute)            \
  X(cuDevicePrimaryCtxRetain)        \
  X(cuDevicePrimaryCtxRelease)       \
  X(cuCtxGetCurrent)                 \
  X(cuCtxSetCurrent)                 \
  X(cuCtxSynchronize)                \
  X(cuMemGetInfo)                    \
  X(cuMemGetAllocationGranularity)   \
  X(cuMemCreate)                     \
  X(cuMemRelease)                    \
  X(cuMemAddressReserve)             \
  X(cuMemAddressFree)                \
  X(cuMemMap)                        \
  X(cuMemUnmap)                      \
  X(cuMemSetAccess)                  \
  X(cuMemExportToShareableHandle)    \
  X(cuMemImportFromShareableHandle)  \
  X(cuMulticastGetGranularity)       \
  X(cuMulticastCreate)               \
  X(cuMulticastAddDevice)            \
  X(cuMulticastBindMem)              \
  X(cuMulticastUnbind)               \
  X(cuEventCreate)                   \
  X(cuEventRecord)                   \
  X(cuEventQuery)                    \
  X(cuEventSynchronize)              \
  X(cuEventDestroy)                  \
  X(cuStreamSynchronize)             \
  X(cuStreamIsCapturing)             \
  X(cuStreamWriteValue32)            \
  X(cuStreamWaitValue32)             \
  X(cuStreamBatchMemOp)

struct DriverApi {
#define SYMMPOOL_DRIVER_FN(name) decltype(&::name) name = nullptr;
  SYMMPOOL_DRIVER_FUNCTIONS(SYMMPOOL_DRIVER_FN)
#undef SYMMPOOL_DRIVER_FN

  // The driver's own text for `code`, or a generic one.
  const char* error_string(CUresult code) const;
};

// The process-wide real driver table, loaded on first use. Throws
// symmpool::cuda_error when the CUDA runtime cannot reach a driver.
const DriverApi& real_driver();

// Makes `device`'s primary context current for the guard's lifetime, so that
// context-bound calls (events) work whatever the caller had current.
class ContextGuard {
 public:
  ContextGuard(const DriverApi& drv, CUcontext context);
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  const DriverApi& drv_;
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

}  // namespace symmpool
