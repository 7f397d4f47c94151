#include <symmpool/detail/format.hpp>
#include <symmpool/device_allocators.hpp>
#include <symmpool/error.hpp>

#include <array>
#include <mutex>
#include <string>

namespace symmpool {

namespace {

constexpr int kMaxDevices = 64;

struct Registry {
  std::mutex mutex;
  std::array<CachingAllocator*, kMaxDevices> allocators{};
  const DriverApi* driver = nullptr;  // null: the real driver (tests set a fake)
};

Registry& registry() {
  static auto* r = new Registry;  // immortal, see header
  return *r;
}

void check_device_index(int device) {
  SYMMPOOL_EXPECTS(device >= 0 && device < kMaxDevices,
                   "device index " + std::to_string(device) + " is out of range");
}

CachingAllocator* existing(int device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.allocators[static_cast<std::size_t>(device)];
}

}  // namespace

CachingAllocator* existing_device_allocator(int device) {
  check_device_index(device);
  return existing(device);
}

CachingAllocator& device_allocator(int device) {
  check_device_index(device);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto& slot = r.allocators[static_cast<std::size_t>(device)];
  if (slot == nullptr) {
    ArenaOptions options;
    options.multicast_requested = options.env.multicast_requested;
    slot = new CachingAllocator(
        std::make_unique<SegmentArena>(r.driver ? *r.driver : real_driver(), device, options),
        options.env.segment_moves);
  }
  return *slot;
}

CachingAllocator* allocator_owning(const void* ptr) {
  const auto address = reinterpret_cast<CUdeviceptr>(ptr);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (CachingAllocator* a : r.allocators)
    if (a != nullptr && address >= a->va_base() && address - a->va_base() < a->va_reserved_bytes()) return a;
  return nullptr;
}

void free_on_device(void* ptr, std::size_t bytes, int device, CUstream stream) {
  if (ptr == nullptr) return;
  check_device_index(device);
  CachingAllocator* own = existing(device);
  if (own == nullptr || !own->owns(ptr)) {
    if (CachingAllocator* other = allocator_owning(ptr); other != nullptr && other != own)
      SYMMPOOL_FAIL("free of " + detail::format_pointer(ptr) + " on device " + std::to_string(device) +
                    ", but it belongs to device " + std::to_string(other->device()));
    SYMMPOOL_FAIL("free of " + detail::format_pointer(ptr) + " on device " + std::to_string(device) +
                  ": pointer was not allocated by symmpool");
  }
  own->deallocate(ptr, bytes, stream);
}

namespace testing {

void set_device_allocator_driver(const DriverApi* drv) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.driver = drv;
}

void destroy_device_allocators() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (CachingAllocator*& slot : r.allocators) {
    delete slot;
    slot = nullptr;
  }
}

}  // namespace testing

}  // namespace symmpool
