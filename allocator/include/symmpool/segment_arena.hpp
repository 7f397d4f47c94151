#pragma once
// Physical segments of one device: cuMemCreate'd memory mapped into one
// virtual range reserved up front, in segment units, with read-write access
// for the owning device. Observers hear about every map and unmap.
// Not thread-safe: the caching allocator above it holds the lock.

#include <symmpool/detail/range_allocator.hpp>
#include <symmpool/driver_api.hpp>
#include <symmpool/environment.hpp>
#include <symmpool/multicast.hpp>
#include <symmpool/segment.hpp>

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

namespace symmpool {

struct ArenaOptions {
  bool multicast_requested = false;
  // Virtual range to reserve; 0 means twice the device's total memory.
  std::size_t va_reserve_bytes = 0;
  Environment env = Environment::from_process();
};

class SegmentArena {
 public:
  // Internal segments (signal pads of each group's communicator) live in
  // slots of one granule at the top of the range, outside first-fit, so
  // their offsets never depend on what the user allocated before them.
  static constexpr int kInternalSlots = 64;

  SegmentArena(const DriverApi& drv, int device, ArenaOptions options = {});
  const DriverApi& driver() const { return drv_; }
  ~SegmentArena();
  SegmentArena(const SegmentArena&) = delete;
  SegmentArena& operator=(const SegmentArena&) = delete;

  // Creates, maps and announces a segment of at least `bytes` (rounded up to
  // the granularity). Returns nullptr when the device or the virtual range is
  // out of memory; throws on any other failure, leaving nothing behind.
  const Segment* map_new_segment(std::size_t bytes);

  // Maps one granule at internal slot `slot` (0 <= slot < kInternalSlots,
  // free); nullptr when the device is out of memory.
  const Segment* map_internal_segment(int slot);
  // Bit s set: internal slot s is free.
  std::uint64_t free_internal_slots() const { return free_internal_slots_; }
  bool is_internal(const Segment& segment) const { return segment.offset >= user_va_size_; }

  // What becomes of a segment's virtual range once it is unmapped.
  // kPark keeps it out of first-fit until release_parked_ranges: where the
  // unmap happened when an event completed, a range that came back at once
  // would let the next segment's offset depend on that timing, and ranks
  // that allocate alike would place it differently.
  enum class RangeAfterUnmap { kRelease, kPark };

  // Announces, unmaps and releases a segment made by map_new_segment or
  // map_internal_segment.
  void unmap_segment(const Segment* segment, RangeAfterUnmap after = RangeAfterUnmap::kRelease);

  // Parked ranges back to first-fit, at a point in program order (the
  // allocator's release of its cache: empty_cache, an allocation's retry
  // when the device or the range is full); their bytes.
  std::size_t release_parked_ranges();
  std::size_t parked_bytes() const;

  // True when an observer keeps `segment` mapped (peers map it too).
  bool observers_keep(const Segment& segment) const noexcept;

  // Adds an observer; with replay it is first told of every mapped segment.
  void add_observer(SegmentObserver* observer, bool replay_existing);
  // Removes an observer; with replay it is told every mapped segment is going.
  void remove_observer(SegmentObserver* observer, bool replay_existing) noexcept;

  const Segment* find(std::uintptr_t address) const;  // segment holding address, or null
  std::vector<const Segment*> segments() const;

  int device() const { return device_; }
  CUcontext context() const { return context_; }
  std::size_t granularity() const { return granularity_; }
  std::size_t mapped_bytes() const { return mapped_bytes_; }
  std::size_t segment_count() const { return segments_.size(); }
  std::size_t va_reserved_bytes() const { return va_size_; }
  CUdeviceptr va_base() const { return va_base_; }
  const MulticastDecision& multicast() const { return multicast_; }

  // Free and total memory of the device, as the driver reports them.
  std::pair<std::size_t, std::size_t> device_memory_info() const;

 private:
  CUresult create_handle(std::size_t size, CUmemGenericAllocationHandle* handle,
                         CUmemAllocationHandleType* types);
  const Segment* map_segment_at(std::size_t offset, std::size_t size);
  void announce_unmapping(const Segment& segment) noexcept;

  const DriverApi& drv_;
  int device_;
  CUdevice cu_device_ = 0;
  CUcontext context_ = nullptr;
  MulticastDecision multicast_;
  bool fabric_supported_ = false;
  std::size_t granularity_ = 0;
  CUdeviceptr va_base_ = 0;
  std::size_t va_size_ = 0;
  std::size_t user_va_size_ = 0;  // below: first-fit; above: internal slots
  std::uint64_t free_internal_slots_ = ~std::uint64_t{0};
  std::unique_ptr<detail::RangeAllocator> va_ranges_;
  std::map<CUdeviceptr, std::unique_ptr<Segment>> segments_;  // by address
  std::vector<SegmentObserver*> observers_;
  std::size_t mapped_bytes_ = 0;
  std::vector<std::pair<std::size_t, std::size_t>> parked_ranges_;  // (offset, size), unmapped
  std::uint64_t next_id_ = 1;
};

}  // namespace symmpool
