#pragma once
// The driver table: every CUDA driver call symmpool makes goes through these
// function pointers. The real table is filled from cudaGetDriverEntryPoint, so
// nothing links libcuda; tests swap in a fake table (symmpool/testing/fake_driver.hpp).

#include <cuda.h>
#include <cudaTypedefs.h>

#include <type_traits>

namespace symmpool {

// Every CUDA driver function symmpool calls, listed once (an X-macro): a user
// defines X(name, version) and expands SYMMPOOL_DRIVER_FUNCTIONS(X). DriverApi
// below declares the members, driver_api.cpp loads #name at `version`, and
// fake_driver.cpp sets each to its fake_##name. Adding a function is one line
// here plus its fake. `name` is cuda.h's unversioned name, whose prototype
// (after the headers' renames, cuMemGetInfo -> cuMemGetInfo_v2) is the
// member's type; `version` is the driver ABI of that prototype, as
// cudaTypedefs.h names it (PFN_<name>_v<version>), checked below at compile
// time. Asking at the toolkit's CUDA_VERSION instead is wrong where a newer
// ABI kept the old name: at 13000, "cuCtxSynchronize" is
// cuCtxSynchronize_v2(CUcontext), called with no argument (a crash).
#define SYMMPOOL_DRIVER_FUNCTIONS(X)          \
  X(cuGetErrorString, 6000)                   \
  X(cuDeviceGet, 2000)                        \
  X(cuDeviceGetCount, 2000)                   \
  X(cuDeviceGetAttribute, 2000)               \
  X(cuDevicePrimaryCtxRetain, 7000)           \
  X(cuDevicePrimaryCtxRelease, 11000)         \
  X(cuCtxGetCurrent, 4000)                    \
  X(cuCtxSetCurrent, 4000)                    \
  X(cuCtxSynchronize, 2000)                   \
  X(cuMemGetInfo, 3020)                       \
  X(cuMemGetAllocationGranularity, 10020)     \
  X(cuMemCreate, 10020)                       \
  X(cuMemRelease, 10020)                      \
  X(cuMemAddressReserve, 10020)               \
  X(cuMemAddressFree, 10020)                  \
  X(cuMemMap, 10020)                          \
  X(cuMemUnmap, 10020)                        \
  X(cuMemSetAccess, 10020)                    \
  X(cuMemExportToShareableHandle, 10020)      \
  X(cuMemImportFromShareableHandle, 10020)    \
  X(cuMulticastGetGranularity, 12010)         \
  X(cuMulticastCreate, 12010)                 \
  X(cuMulticastAddDevice, 12010)              \
  X(cuMulticastBindMem, 12010)                \
  X(cuMulticastUnbind, 12010)                 \
  X(cuEventCreate, 2000)                      \
  X(cuEventRecord, 2000)                      \
  X(cuEventQuery, 2000)                       \
  X(cuEventSynchronize, 2000)                 \
  X(cuEventDestroy, 4000)                     \
  X(cuStreamWaitEvent, 3020)                  \
  X(cuStreamIsCapturing, 10000)               \
  X(cuStreamGetCaptureInfo, 12030) /* _v3 */  \
  X(cuLaunchKernel, 4000)                     \
  X(cuThreadExchangeStreamCaptureMode, 10010) \
  X(cuStreamWriteValue32, 11070)              \
  X(cuStreamWaitValue32, 11070)               \
  X(cuStreamBatchMemOp, 11070)

struct DriverApi {
#define SYMMPOOL_DRIVER_FN(name, version) decltype(&::name) name = nullptr;
  SYMMPOOL_DRIVER_FUNCTIONS(SYMMPOOL_DRIVER_FN)
#undef SYMMPOOL_DRIVER_FN

  // The driver's own text for `code`, or a generic one.
  const char* error_string(CUresult code) const;
};

#define SYMMPOOL_DRIVER_ABI_CHECK(name, version)                            \
  static_assert(std::is_same_v<decltype(&::name), PFN_##name##_v##version>, \
                #name " is not the ABI of version " #version " (cudaTypedefs.h)");
SYMMPOOL_DRIVER_FUNCTIONS(SYMMPOOL_DRIVER_ABI_CHECK)
#undef SYMMPOOL_DRIVER_ABI_CHECK

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
