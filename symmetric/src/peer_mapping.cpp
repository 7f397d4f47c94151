#include <symmpool/error.hpp>
#include <symmpool/peer_mapping.hpp>

#include <cstdio>

namespace symmpool {

PeerAddressRange::PeerAddressRange(const DriverApi& drv, std::size_t bytes, std::size_t alignment)
    : drv_(drv), bytes_(bytes) {
  SYMMPOOL_CU_TRY(drv_, cuMemAddressReserve(&base_, bytes, alignment, 0, 0));
}

PeerAddressRange::~PeerAddressRange() { drv_.cuMemAddressFree(base_, bytes_); }

PeerMapping::PeerMapping(const DriverApi& drv, CUcontext context, int device,
                         std::shared_ptr<PeerAddressRange> range, std::size_t offset, std::size_t size,
                         CUmemGenericAllocationHandle handle)
    : drv_(drv), context_(context), range_(std::move(range)), offset_(offset), size_(size), handle_(handle) {
  const CUdeviceptr address = range_->base() + offset_;
  CUresult r = drv_.cuMemMap(address, size_, 0, handle_, 0);
  if (r != CUDA_SUCCESS) {
    drv_.cuMemRelease(handle_);
    detail::throw_cuda_error(__FILE__, __LINE__, "cuMemMap (peer segment)", r, drv_.error_string(r));
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = drv_.cuMemSetAccess(address, size_, &access, 1);
  if (r != CUDA_SUCCESS) {
    drv_.cuMemUnmap(address, size_);
    drv_.cuMemRelease(handle_);
    detail::throw_cuda_error(__FILE__, __LINE__, "cuMemSetAccess (peer segment)", r, drv_.error_string(r));
  }
}

PeerMapping::~PeerMapping() {
  try {
    ContextGuard guard(drv_, context_);
    if (CUresult r = drv_.cuCtxSynchronize(); r != CUDA_SUCCESS) {
      std::fprintf(stderr,
                   "symmpool: a peer segment (offset %zu, %zu bytes) stays mapped: waiting for the device "
                   "failed: %s\n",
                   offset_, size_, drv_.error_string(r));
      // Its range must outlive it: kept reserved for the process's lifetime.
      static_cast<void>(new std::shared_ptr<PeerAddressRange>(std::move(range_)));
      return;
    }
    const CUresult a = drv_.cuMemUnmap(range_->base() + offset_, size_);
    const CUresult b = drv_.cuMemRelease(handle_);
    if (a != CUDA_SUCCESS || b != CUDA_SUCCESS)
      std::fprintf(stderr, "symmpool: unmapping a peer segment (offset %zu, %zu bytes) failed (%d, %d)\n",
                   offset_, size_, int(a), int(b));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "symmpool: unmapping a peer segment failed: %s\n", e.what());
  }
}

}  // namespace symmpool
