#include <symmpool/detail/checked_size.hpp>
#include <symmpool/detail/format.hpp>
#include <symmpool/detail/scope_exit.hpp>
#include <symmpool/error.hpp>
#include <symmpool/log.hpp>
#include <symmpool/segment_arena.hpp>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>

namespace symmpool {

namespace {

CUmemAllocationProp allocation_prop(CUdevice device, CUmemAllocationHandleType types) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = types;
  return prop;
}

// Twice the device's memory, rounded to the granularity; the driver's figure
// is trusted no more than a caller's, so the doubling is checked too.
std::size_t default_va_size(std::size_t total_bytes, std::size_t granularity, int device) {
  if (total_bytes > (SIZE_MAX - granularity) / 2)
    throw out_of_memory("symmpool: device " + std::to_string(device) + " reports " +
                        detail::format_bytes(total_bytes) +
                        " of memory: twice that does not fit in a virtual range; set "
                        "ArenaOptions::va_reserve_bytes");
  return detail::round_up_checked(2 * total_bytes, granularity, "virtual range reservation");
}

int device_attribute(const DriverApi& drv, CUdevice device, CUdevice_attribute attr) {
  int value = 0;
  SYMMPOOL_CU_TRY(drv, cuDeviceGetAttribute(&value, attr, device));
  return value;
}

}  // namespace

SegmentArena::SegmentArena(const DriverApi& drv, int device, ArenaOptions options)
    : drv_(drv), device_(device) {
  int count = 0;
  SYMMPOOL_CU_TRY(drv_, cuDeviceGetCount(&count));
  SYMMPOOL_EXPECTS(device >= 0 && device < count, "device " + std::to_string(device) +
                                                      " is not a CUDA device (this process sees " +
                                                      std::to_string(count) + ")");
  SYMMPOOL_CU_TRY(drv_, cuDeviceGet(&cu_device_, device));
  SYMMPOOL_EXPECTS(
      device_attribute(drv_, cu_device_, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
      "device " + std::to_string(device) + " does not support CUDA virtual memory management");
  SYMMPOOL_EXPECTS(
      device_attribute(drv_, cu_device_, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED),
      "device " + std::to_string(device) + " cannot export memory as POSIX file descriptors");
  fabric_supported_ =
      device_attribute(drv_, cu_device_, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED) != 0;
  multicast_ = decide_multicast(drv_, cu_device_, options.multicast_requested, options.env);

  SYMMPOOL_CU_TRY(drv_, cuDevicePrimaryCtxRetain(&context_, cu_device_));
  detail::ScopeExit release_context([&] { drv_.cuDevicePrimaryCtxRelease(cu_device_); });

  CUmemAllocationProp prop = allocation_prop(cu_device_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  SYMMPOOL_CU_TRY(drv_,
                  cuMemGetAllocationGranularity(&granularity_, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  if (multicast_.enabled) {
    CUmulticastObjectProp mc{};
    mc.numDevices = 1;
    mc.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    mc.size = granularity_;
    std::size_t mc_granularity = 0;
    SYMMPOOL_CU_TRY(drv_, cuMulticastGetGranularity(&mc_granularity, &mc, CU_MULTICAST_GRANULARITY_MINIMUM));
    granularity_ = std::lcm(granularity_, mc_granularity);
  }

  if (options.va_reserve_bytes != 0) {
    va_size_ = detail::round_up_checked(options.va_reserve_bytes, granularity_, "virtual range reservation");
  } else {
    ContextGuard guard(drv_, context_);
    std::size_t free_bytes = 0, total_bytes = 0;
    SYMMPOOL_CU_TRY(drv_, cuMemGetInfo(&free_bytes, &total_bytes));
    va_size_ = default_va_size(total_bytes, granularity_, device);
  }
  // Up to kInternalSlots, never more than a quarter of the range (small
  // ranges in tests); the same on every rank, whose ranges are equal.
  const std::size_t slots = std::min<std::size_t>(kInternalSlots, va_size_ / granularity_ / 4);
  SYMMPOOL_EXPECTS(slots >= 1, "a virtual range of " + std::to_string(va_size_) +
                                   " bytes leaves no room for internal segments");
  const std::size_t internal_bytes = slots * granularity_;
  free_internal_slots_ = slots == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << slots) - 1;
  SYMMPOOL_CU_TRY(drv_, cuMemAddressReserve(&va_base_, va_size_, granularity_, 0, 0));
  user_va_size_ = va_size_ - internal_bytes;
  va_ranges_ = std::make_unique<detail::RangeAllocator>(user_va_size_);
  release_context.dismiss();
}

SegmentArena::~SegmentArena() {
  // unmap_segment forgets a segment even when its unmap fails; one it could
  // not even forget is dropped here, so the loop always ends.
  while (!segments_.empty()) {
    const std::size_t before = segments_.size();
    try {
      unmap_segment(segments_.begin()->second.get());
    } catch (const std::exception& e) {
      SYMMPOOL_WARN(kAlloc, "while destroying the arena of device %d: %s", device_, e.what());
    }
    if (segments_.size() == before) segments_.erase(segments_.begin());
  }
  drv_.cuMemAddressFree(va_base_, va_size_);
  drv_.cuDevicePrimaryCtxRelease(cu_device_);
}

CUresult SegmentArena::create_handle(std::size_t size, CUmemGenericAllocationHandle* handle,
                                     CUmemAllocationHandleType* types) {
  if (fabric_supported_) {
    auto both = static_cast<CUmemAllocationHandleType>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR |
                                                       CU_MEM_HANDLE_TYPE_FABRIC);
    CUmemAllocationProp prop = allocation_prop(cu_device_, both);
    CUresult r = drv_.cuMemCreate(handle, size, &prop, 0);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_OUT_OF_MEMORY) {
      *types = both;
      return r;
    }
    // The device reports fabric support but this system cannot make fabric
    // handles (no IMEX channel, say): stay on file descriptors from now on.
    fabric_supported_ = false;
  }
  CUmemAllocationProp prop = allocation_prop(cu_device_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  *types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return drv_.cuMemCreate(handle, size, &prop, 0);
}

const Segment* SegmentArena::map_new_segment(std::size_t bytes) {
  SYMMPOOL_EXPECTS(bytes > 0, "a segment needs a size above zero");
  if (bytes > user_va_size_) return nullptr;
  const std::size_t size = detail::round_up_checked(bytes, granularity_, "segment");
  auto offset = va_ranges_->allocate(size);
  if (!offset) return nullptr;
  detail::ScopeExit release_range([&] { va_ranges_->release(*offset, size); });
  const Segment* segment = map_segment_at(*offset, size);
  if (segment != nullptr) release_range.dismiss();
  return segment;
}

const Segment* SegmentArena::map_internal_segment(int slot) {
  SYMMPOOL_EXPECTS(slot >= 0 && slot < kInternalSlots && (free_internal_slots_ >> slot & 1u) &&
                       user_va_size_ + (std::size_t(slot) + 1) * granularity_ <= va_size_,
                   "internal slot " + std::to_string(slot) + " is not free");
  const Segment* segment = map_segment_at(user_va_size_ + std::size_t(slot) * granularity_, granularity_);
  if (segment != nullptr) free_internal_slots_ &= ~(std::uint64_t{1} << slot);
  return segment;
}

// Creates, maps and announces a segment at [offset, offset + size), which
// the caller has reserved; nullptr when the device is out of memory.
const Segment* SegmentArena::map_segment_at(std::size_t offset, std::size_t size) {
  auto segment = std::make_unique<Segment>();
  segment->id = next_id_++;
  segment->device = device_;
  segment->offset = offset;
  segment->address = va_base_ + offset;
  segment->size = size;
  segment->multicast_capable = multicast_.enabled;

  CUresult r = create_handle(size, &segment->handle, &segment->handle_types);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
  if (r != CUDA_SUCCESS) detail::throw_cuda_error(__FILE__, __LINE__, "cuMemCreate", r, drv_.error_string(r));
  detail::ScopeExit release_handle([&] { drv_.cuMemRelease(segment->handle); });

  r = drv_.cuMemMap(segment->address, size, 0, segment->handle, 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
  if (r != CUDA_SUCCESS) detail::throw_cuda_error(__FILE__, __LINE__, "cuMemMap", r, drv_.error_string(r));
  detail::ScopeExit unmap([&] { drv_.cuMemUnmap(segment->address, size); });

  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = cu_device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = drv_.cuMemSetAccess(segment->address, size, &access, 1);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
  if (r != CUDA_SUCCESS)
    detail::throw_cuda_error(__FILE__, __LINE__, "cuMemSetAccess", r, drv_.error_string(r));

  // Observers in order; if one throws, the ones already told hear the unmap.
  std::size_t told = 0;
  try {
    for (; told < observers_.size(); ++told) observers_[told]->on_segment_mapped(*segment);
  } catch (...) {
    while (told > 0) observers_[--told]->on_segment_unmapping(*segment);
    throw;
  }

  unmap.dismiss();
  release_handle.dismiss();
  mapped_bytes_ += size;
  const Segment* result = segment.get();
  segments_.emplace(segment->address, std::move(segment));
  return result;
}

void SegmentArena::announce_unmapping(const Segment& segment) noexcept {
  for (auto it = observers_.rbegin(); it != observers_.rend(); ++it) (*it)->on_segment_unmapping(segment);
}

std::size_t SegmentArena::parked_bytes() const {
  std::size_t bytes = 0;
  for (const auto& range : parked_ranges_) bytes += range.second;
  return bytes;
}

std::size_t SegmentArena::release_parked_ranges() {
  const std::size_t bytes = parked_bytes();
  for (const auto& [offset, size] : parked_ranges_) va_ranges_->release(offset, size);
  parked_ranges_.clear();
  return bytes;
}

void SegmentArena::unmap_segment(const Segment* segment, RangeAfterUnmap after) {
  auto it = segments_.find(segment->address);
  SYMMPOOL_EXPECTS(it != segments_.end() && it->second.get() == segment,
                   "segment is not mapped by this arena");
  announce_unmapping(*segment);
  std::unique_ptr<Segment> owned = std::move(it->second);
  segments_.erase(it);
  mapped_bytes_ -= owned->size;
  // Unmap and release both, even if the first fails, then report.
  CUresult unmap_status = drv_.cuMemUnmap(owned->address, owned->size);
  CUresult release_status = drv_.cuMemRelease(owned->handle);
  // A range still mapped stays out of circulation: a segment mapped there
  // next would fail to map, and every allocation landing there with it.
  if (unmap_status == CUDA_SUCCESS) {
    if (is_internal(*owned)) {
      free_internal_slots_ |= std::uint64_t{1} << ((owned->offset - user_va_size_) / granularity_);
    } else if (after == RangeAfterUnmap::kPark) {
      parked_ranges_.emplace_back(owned->offset, owned->size);
    } else {
      va_ranges_->release(owned->offset, owned->size);
    }
  }
  if (unmap_status != CUDA_SUCCESS)
    detail::throw_cuda_error(__FILE__, __LINE__, "cuMemUnmap", unmap_status, drv_.error_string(unmap_status));
  if (release_status != CUDA_SUCCESS)
    detail::throw_cuda_error(__FILE__, __LINE__, "cuMemRelease", release_status,
                             drv_.error_string(release_status));
}

void SegmentArena::add_observer(SegmentObserver* observer, bool replay_existing) {
  SYMMPOOL_EXPECTS(observer != nullptr, "observer must not be null");
  SYMMPOOL_EXPECTS(std::find(observers_.begin(), observers_.end(), observer) == observers_.end(),
                   "observer is already attached");
  if (replay_existing) {
    std::vector<const Segment*> told;
    try {
      for (auto& [address, segment] : segments_) {
        observer->on_segment_mapped(*segment);
        told.push_back(segment.get());
      }
    } catch (...) {
      for (const Segment* s : told) observer->on_segment_unmapping(*s);
      throw;
    }
  }
  observers_.push_back(observer);
}

void SegmentArena::remove_observer(SegmentObserver* observer, bool replay_existing) noexcept {
  auto it = std::find(observers_.begin(), observers_.end(), observer);
  if (it == observers_.end()) return;
  observers_.erase(it);
  if (replay_existing)
    for (auto& [address, segment] : segments_) observer->on_segment_unmapping(*segment);
}

bool SegmentArena::observers_keep(const Segment& segment) const noexcept {
  for (SegmentObserver* o : observers_)
    if (o->keeps_mapped(segment)) return true;
  return false;
}

const Segment* SegmentArena::find(std::uintptr_t address) const {
  auto it = segments_.upper_bound(address);
  if (it == segments_.begin()) return nullptr;
  --it;
  return it->second->contains(address) ? it->second.get() : nullptr;
}

std::vector<const Segment*> SegmentArena::segments() const {
  std::vector<const Segment*> out;
  out.reserve(segments_.size());
  for (auto& [address, segment] : segments_) out.push_back(segment.get());
  return out;
}

std::pair<std::size_t, std::size_t> SegmentArena::device_memory_info() const {
  ContextGuard guard(drv_, context_);
  std::size_t free_bytes = 0, total_bytes = 0;
  SYMMPOOL_CU_TRY(drv_, cuMemGetInfo(&free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

}  // namespace symmpool
