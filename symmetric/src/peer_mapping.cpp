#include <symmpool/error.hpp>
#include <symmpool/log.hpp>
#include <symmpool/peer_mapping.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <vector>

namespace symmpool {

namespace {

struct Retired {
  std::uint64_t sequence;  // in retiring order
  const DriverApi* drv;
  CUcontext context;
  std::shared_ptr<PeerAddressRange> range;
  std::size_t offset;
  std::size_t size;
  CUmemGenericAllocationHandle handle;
};

// Never destroyed: a view's deleter may retire a mapping during static destruction.
struct RetiredList {
  std::mutex mutex;
  std::vector<Retired> mappings;
  std::uint64_t next_sequence = 0;
};

RetiredList& retired_list() {
  static auto* list = new RetiredList;
  return *list;
}

}  // namespace

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
  RetiredList& list = retired_list();
  std::lock_guard<std::mutex> lock(list.mutex);
  list.mappings.push_back(
      Retired{list.next_sequence++, &drv_, context_, std::move(range_), offset_, size_, handle_});
}

std::uint64_t retired_peer_mapping_sequence() {
  RetiredList& list = retired_list();
  std::lock_guard<std::mutex> lock(list.mutex);
  return list.next_sequence;
}

std::size_t release_retired_peer_mappings(const DriverApi& drv, CUcontext context,
                                          std::uint64_t retired_before) noexcept {
  std::vector<Retired> mine;
  {
    RetiredList& list = retired_list();
    std::lock_guard<std::mutex> lock(list.mutex);
    auto split = std::stable_partition(list.mappings.begin(), list.mappings.end(), [&](const Retired& m) {
      return m.context != context || m.sequence >= retired_before;
    });
    mine.assign(std::make_move_iterator(split), std::make_move_iterator(list.mappings.end()));
    list.mappings.erase(split, list.mappings.end());
  }
  const std::size_t count = mine.size();
  try {
    ContextGuard guard(drv, context);
    for (Retired& m : mine) {
      const CUresult a = drv.cuMemUnmap(m.range->base() + m.offset, m.size);
      const CUresult b = drv.cuMemRelease(m.handle);
      if (a != CUDA_SUCCESS || b != CUDA_SUCCESS)
        SYMMPOOL_WARN(kHeap, "unmapping a peer segment (offset %zu, %zu bytes) failed (%d, %d)", m.offset,
                      m.size, int(a), int(b));
    }
    mine.clear();                      // their ranges go with them, once no mapping holds one
  } catch (const std::exception& e) {  // the context could not be made current: nothing was unmapped
    SYMMPOOL_WARN(kHeap, "unmapping retired peer segments failed: %s", e.what());
    RetiredList& list = retired_list();
    std::lock_guard<std::mutex> lock(list.mutex);
    for (Retired& m : mine) list.mappings.push_back(std::move(m));
    return 0;
  }
  return count;
}

bool retired_peer_mapping_overlaps(const PeerAddressRange* range, std::size_t offset, std::size_t size) {
  RetiredList& list = retired_list();
  std::lock_guard<std::mutex> lock(list.mutex);
  return std::any_of(list.mappings.begin(), list.mappings.end(), [&](const Retired& m) {
    return m.range.get() == range && offset < m.offset + m.size && m.offset < offset + size;
  });
}

std::size_t retired_peer_mappings(CUcontext context) {
  RetiredList& list = retired_list();
  std::lock_guard<std::mutex> lock(list.mutex);
  return static_cast<std::size_t>(std::count_if(list.mappings.begin(), list.mappings.end(),
                                                [&](const Retired& m) { return m.context == context; }));
}

}  // namespace symmpool
