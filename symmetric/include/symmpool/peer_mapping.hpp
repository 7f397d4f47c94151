#pragma once
// A peer's segment mapped into this process, owned by whoever still reads
// it: the symmetric heap while the peer publishes the segment, and any
// tensor view of it (symmpool.peer_tensor) for as long as the view lives.
// The last owner retires it: its mapping stays (the imported handle keeps
// the memory alive) until a caller that has waited for the device unmaps
// what was retired (release_retired_peer_mappings): a view's deleter may run
// inside a graph capture or while a kernel still reads the view, where no
// wait or unmap is safe. A view that outlives the heap, or the peer's
// release, so reads memory that is still mapped instead of an address that
// faults. The reserved range a mapping lies in goes once its last mapping has.

#include <symmpool/driver_api.hpp>

#include <cstddef>
#include <cstdint>
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
  ~PeerMapping();  // retires it: no driver call (see above)
  PeerMapping(const PeerMapping&) = delete;
  PeerMapping& operator=(const PeerMapping&) = delete;

  std::size_t offset() const { return offset_; }
  std::size_t size() const { return size_; }
  void* address() const { return reinterpret_cast<void*>(range_->base() + offset_); }

 private:
  const DriverApi& drv_;
  CUcontext context_;
  std::shared_ptr<PeerAddressRange> range_;
  std::size_t offset_;
  std::size_t size_;
  CUmemGenericAllocationHandle handle_;
};

// How many mappings have retired so far (a mark for the call below).
std::uint64_t retired_peer_mapping_sequence();
// Unmaps the mappings of `context` retired before the mark `retired_before`.
// The caller took the mark, then waited for the device (cuCtxSynchronize):
// what retired since may still be read by queued work. Returns how many.
std::size_t release_retired_peer_mappings(const DriverApi& drv, CUcontext context,
                                          std::uint64_t retired_before) noexcept;
// Whether a retired mapping of `range` still covers part of [offset, offset + size).
bool retired_peer_mapping_overlaps(const PeerAddressRange* range, std::size_t offset, std::size_t size);
std::size_t retired_peer_mappings(CUcontext context);

}  // namespace symmpool
