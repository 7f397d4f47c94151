#include <symmpool/driver_api.hpp>
#include <symmpool/error.hpp>

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

namespace symmpool {

const char* DriverApi::error_string(CUresult code) const {
  const char* text = nullptr;
  if (cuGetErrorString != nullptr && cuGetErrorString(code, &text) == CUDA_SUCCESS && text) return text;
  return "unknown CUDA driver error";
}

namespace {

// `version` is the ABI of the prototype `fn` has (see driver_api.hpp).
template <typename Fn>
void load(Fn& fn, const char* symbol, unsigned int version) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status{};
  cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &ptr, version, cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || ptr == nullptr) {
    throw cuda_error(std::string("symmpool: cannot load CUDA driver entry point ") + symbol + " (" +
                         cudaGetErrorString(err) + ", query status " +
                         std::to_string(static_cast<int>(status)) + ")",
                     CUDA_ERROR_NOT_FOUND);
  }
  fn = reinterpret_cast<Fn>(ptr);
}

DriverApi load_real_driver() {
  DriverApi d;
#define SYMMPOOL_LOAD(name, version) load(d.name, #name, version);
  SYMMPOOL_DRIVER_FUNCTIONS(SYMMPOOL_LOAD)
#undef SYMMPOOL_LOAD
  return d;
}

}  // namespace

const DriverApi& real_driver() {
  // call_once retries after a throw, so a failed load throws again, naming the symbol.
  static std::once_flag once;
  static DriverApi table;
  std::call_once(once, [] { table = load_real_driver(); });
  return table;
}

ContextGuard::ContextGuard(const DriverApi& drv, CUcontext context) : drv_(drv) {
  SYMMPOOL_CU_TRY(drv_, cuCtxGetCurrent(&previous_));
  if (previous_ != context) {
    SYMMPOOL_CU_TRY(drv_, cuCtxSetCurrent(context));
    switched_ = true;
  }
}

ContextGuard::~ContextGuard() {
  if (switched_) drv_.cuCtxSetCurrent(previous_);
}

}  // namespace symmpool
