#pragma once
// A peer's segment mapped into this process, owned by whoever still reads
// it: the symmetric heap while the peer publishes the segment, and any
// tensor view of it (symmpool.peer_tensor) for as long as the view lives.
// The last owner unmaps it, so a view that outlives the heap, or the peer's
// release of the segment, reads memory that is still mapped (the imported
// handle keeps it alive) instead of an address that faults. The reserved
// range it lies in goes once its last mapping has.

#include <symmpool/driver_api.hpp>

#include <cstddef>
#include <memory>

namespace symmpool {

// One peer's reserved address range (as large as the allocator's).
class PeerAddressRange {
 public:
  // Reserves `bytes` aligned to `alignment`; throws cuda_error.
  PeerAddressRange(const DriverApi& drv, std::size_t bytes, std::size_t alignment);
  ~PeerAddressRange();
  PeerAddressRange(const PeerAddressRange&) = delete;
  PeerAddressRange& operator=(const PeerAddressRange&) = delete;

  CUdeviceptr base() const { return base_; }

 private:
  const DriverApi& drv_;
  CUdeviceptr base_ = 0;
  std::size_t bytes_;
};

class PeerMapping {
 public:
  // Maps `handle` (imported; owned from now on, also when this throws) at
  // `offset` of `range` with read-write access for `device`; throws cuda_error.
  PeerMapping(const DriverApi& drv, CUcontext context, int device, std::shared_ptr<PeerAddressRange> range,
              std::size_t offset, std::size_t size, CUmemGenericAllocationHandle handle);
  // Waits for the device first (a kernel queued before the last owner let go
  // may still read it); where that wait fails (a capture under way, a sticky
  // error) the mapping stays, said on stderr, rather than fault a kernel.
  ~PeerMapping();
  PeerMapping(const PeerMapping&) = delete;
  PeerMapping& operator=(const PeerMapping&) = delete;

  std::size_t offset() const { return offset_; }
  std::size_t size() const { return size_; }
  void* address() const { return reinterpret_cast<void*>(range_->base() + offset_); }
  bool overlaps(std::size_t offset, std::size_t size) const {
    return offset < offset_ + size_ && offset_ < offset + size;
  }

 private:
  const DriverApi& drv_;
  CUcontext context_;
  std::shared_ptr<PeerAddressRange> range_;
  std::size_t offset_;
  std::size_t size_;
  CUmemGenericAllocationHandle handle_;
};

}  // namespace symmpool
