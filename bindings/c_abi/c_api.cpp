#include <symmpool/c_api.h>
#include <symmpool/device_allocators.hpp>
#include <symmpool/log.hpp>

#include <cstdio>
#include <exception>
#include <string>

namespace {

thread_local std::string last_error;

void report(const char* function, const std::exception& e) {
  last_error = e.what();
  SYMMPOOL_WARN(kAlloc, "%s: %s", function, e.what());
}

CUstream as_driver_stream(cudaStream_t stream) { return reinterpret_cast<CUstream>(stream); }

}  // namespace

extern "C" {

void* symmpool_malloc(size_t size, int device, cudaStream_t stream) {
  last_error.clear();
  try {
    return symmpool::device_allocator(device).allocate(size, as_driver_stream(stream));
  } catch (const std::exception& e) {
    report("symmpool_malloc", e);
    return nullptr;
  }
}

void symmpool_free(void* ptr, size_t size, int device, cudaStream_t stream) {
  last_error.clear();
  try {
    symmpool::free_on_device(ptr, size, device, as_driver_stream(stream));
  } catch (const std::exception& e) {
    report("symmpool_free", e);
  }
}

long long symmpool_empty_cache(int device) {
  last_error.clear();
  try {
    // A device this process never allocated on has nothing cached: creating
    // its allocator (and CUDA context) just to empty it would be waste.
    symmpool::CachingAllocator* allocator = symmpool::existing_device_allocator(device);
    return allocator ? static_cast<long long>(allocator->empty_cache()) : 0;
  } catch (const std::exception& e) {
    report("symmpool_empty_cache", e);
    return -1;
  }
}

const char* symmpool_last_error(void) { return last_error.c_str(); }

}  // extern "C"
