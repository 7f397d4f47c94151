#pragma once
// A physical segment: one cuMemCreate allocation mapped at one place in the
// device's reserved virtual range, and the observer interface that
// registration hooks implement.

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace symmpool {

struct Segment {
  std::uint64_t id = 0;  // unique within its arena, never reused
  int device = -1;
  CUdeviceptr address = 0;  // where it is mapped
  std::size_t size = 0;     // a multiple of the arena's granularity
  std::size_t offset = 0;   // address - arena base: equal on SPMD ranks
  CUmemGenericAllocationHandle handle = 0;
  CUmemAllocationHandleType handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  bool multicast_capable = false;  // sized and aligned for a multicast binding

  void* ptr() const { return reinterpret_cast<void*>(address); }
  bool contains(std::uintptr_t p) const { return p >= address && p < address + size; }
};

// Told about every segment after it is mapped and before it is unmapped.
// Exceptions from on_segment_mapped undo the mapping and reach the caller;
// on_segment_unmapping must not throw (it runs on release paths).
class SegmentObserver {
 public:
  virtual ~SegmentObserver() = default;
  virtual void on_segment_mapped(const Segment& segment) = 0;
  virtual void on_segment_unmapping(const Segment& segment) noexcept = 0;
  // True when `segment` must stay mapped while this observer lives, even if
  // no block uses it: peers map it, and a new segment at its offset would
  // differ from what they see. Called under the allocator's lock.
  virtual bool keeps_mapped(const Segment& /*segment*/) const noexcept { return false; }
};

}  // namespace symmpool
