#pragma once
// The driver table: every CUDA driver call symmpool makes goes through these
// function pointers. The real table is filled from cudaGetDriverEntryPoint, so
// nothing links libcuda; tests swap in a fake table (symmpool/testing/fake_driver.hpp).

#include <cuda.h>

namespace symmpool {

struct DriverApi {
#define SYMMPOOL_DRIVER_FN(name) decltype(&::name) name = nullptr
  SYMMPOOL_DRIVER_FN(cuGetErrorString);
  SYMMPOOL_DRIVER_FN(cuDeviceGet);
  SYMMPOOL_DRIVER_FN(cuDeviceGetCount);
  SYMMPOOL_DRIVER_FN(cuDeviceGetAttribute);
  SYMMPOOL_DRIVER_FN(cuDevicePrimaryCtxRetain);
  SYMMPOOL_DRIVER_FN(cuDevicePrimaryCtxRelease);
  SYMMPOOL_DRIVER_FN(cuCtxGetCurrent);
  SYMMPOOL_DRIVER_FN(cuCtxSetCurrent);
  SYMMPOOL_DRIVER_FN(cuMemGetInfo);
  SYMMPOOL_DRIVER_FN(cuMemGetAllocationGranularity);
  SYMMPOOL_DRIVER_FN(cuMemCreate);
  SYMMPOOL_DRIVER_FN(cuMemRelease);
  SYMMPOOL_DRIVER_FN(cuMemAddressReserve);
  SYMMPOOL_DRIVER_FN(cuMemAddressFree);
  SYMMPOOL_DRIVER_FN(cuMemMap);
  SYMMPOOL_DRIVER_FN(cuMemUnmap);
  SYMMPOOL_DRIVER_FN(cuMemSetAccess);
  SYMMPOOL_DRIVER_FN(cuMemExportToShareableHandle);
  SYMMPOOL_DRIVER_FN(cuMemImportFromShareableHandle);
  SYMMPOOL_DRIVER_FN(cuMulticastGetGranularity);
  SYMMPOOL_DRIVER_FN(cuMulticastCreate);
  SYMMPOOL_DRIVER_FN(cuMulticastAddDevice);
  SYMMPOOL_DRIVER_FN(cuMulticastBindMem);
  SYMMPOOL_DRIVER_FN(cuMulticastUnbind);
  SYMMPOOL_DRIVER_FN(cuEventCreate);
  SYMMPOOL_DRIVER_FN(cuEventRecord);
  SYMMPOOL_DRIVER_FN(cuEventQuery);
  SYMMPOOL_DRIVER_FN(cuEventSynchronize);
  SYMMPOOL_DRIVER_FN(cuEventDestroy);
  SYMMPOOL_DRIVER_FN(cuStreamWriteValue32);
  SYMMPOOL_DRIVER_FN(cuStreamWaitValue32);
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
