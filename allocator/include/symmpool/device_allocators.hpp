#pragma once
// The process-wide caching allocators, one per device, on the real driver.
// Both the C ABI (MemPool) and the torch backend use these, so a process has
// one cache per device. Created on first use and never destroyed: CUDA may
// already be torn down when static destructors run (PyTorch does the same).

#include <symmpool/caching_allocator.hpp>

namespace symmpool {

CachingAllocator& device_allocator(int device);

// The allocator of `device` if this process made one, else nullptr. For
// queries (stats, empty_cache): they must not create an allocator, and with
// it a CUDA context and a virtual range, on a device the process never used.
CachingAllocator* existing_device_allocator(int device);

// The allocator whose reserved virtual range holds `ptr` (ranges of
// different devices never overlap), or nullptr: no lock of an allocator taken.
CachingAllocator* allocator_owning(const void* ptr);

// Frees `ptr` on `device`'s allocator, with a clear error when the pointer
// belongs to another device or to no symmpool allocator.
void free_on_device(void* ptr, std::size_t bytes, int device, CUstream stream);

namespace testing {
// For tests without a GPU: allocators made from now on use `drv` (nullptr:
// the real driver).
void set_device_allocator_driver(const DriverApi* drv);
// Destroys every device allocator (tests only: live pointers become invalid).
void destroy_device_allocators();
}  // namespace testing

}  // namespace symmpool
