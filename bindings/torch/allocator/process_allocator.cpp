#include "allocator/process_allocator.hpp"

#include <symmpool/device_allocators.hpp>
#include <symmpool/error.hpp>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace symmpool::torch_ext {

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::StatType;

CUstream driver_stream(cudaStream_t stream) { return reinterpret_cast<CUstream>(stream); }

[[noreturn]] void unsupported(const std::string& what, const std::string& why) {
  TORCH_CHECK(false, "symmpool's process allocator (symmpool.install()) does not support ", what, ": ", why);
}

PoolId pool_id(c10::MempoolId_t id) { return {id.first, id.second}; }

// A private pool's checkpoint (CUDA graph trees), as torch holds it.
struct PoolState final : cca::AllocatorState {
  PoolState(c10::DeviceIndex d, PoolCheckpoint c) : device(d), checkpoint(std::move(c)) {}
  c10::DeviceIndex device;
  PoolCheckpoint checkpoint;
};

void copy_stat(c10::CachingAllocator::Stat& to, const Stat& from) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.increased;
  to.freed = from.decreased;
}

void copy_stats(c10::CachingAllocator::StatArray& to, const Stat& all, const Stat& small, const Stat& large) {
  copy_stat(to[static_cast<std::size_t>(StatType::AGGREGATE)], all);
  copy_stat(to[static_cast<std::size_t>(StatType::SMALL_POOL)], small);
  copy_stat(to[static_cast<std::size_t>(StatType::LARGE_POOL)], large);
}

class ProcessAllocator final : public cca::CUDAAllocator {
 public:
  c10::DataPtr allocate(std::size_t bytes) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    void* ptr = allocate_on(bytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
    return {ptr, ptr, &free_block, c10::Device(c10::DeviceType::CUDA, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  void* raw_alloc(std::size_t bytes) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    return allocate_on(bytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }
  void* raw_alloc_with_stream(std::size_t bytes, cudaStream_t stream) override {
    return allocate_on(bytes, c10::cuda::current_device(), stream);
  }
  void raw_delete(void* ptr) override { free_block(ptr); }

  void init(int /*device_count*/) override {}
  bool initialized() override { return true; }
  double getMemoryFraction(c10::DeviceIndex /*device*/) override { return 1.0; }  // no cap
  void setMemoryFraction(double fraction, c10::DeviceIndex /*device*/) override {
    if (fraction < 1.0) unsupported("a memory fraction", "it caps nothing but the device's own memory");
  }
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex /*device*/) override {
    return {};  // its segments are cuMem mappings of a fixed size each
  }
  void enable(bool value) override {
    if (!value) unsupported("being disabled", "it is the process's only CUDA allocator");
  }
  bool isEnabled() const override { return true; }

  void emptyCache(c10::MempoolId_t id) override {
    for (int device = 0; device < c10::cuda::device_count(); ++device)
      if (CachingAllocator* a = existing_device_allocator(device))
        pool_id(id) == kDefaultPool ? a->empty_cache() : a->empty_pool_cache(pool_id(id));
  }
  void cacheInfo(c10::DeviceIndex device, std::size_t* largest_block) override {
    CachingAllocator* a = existing_device_allocator(device);
    *largest_block = a ? a->largest_free_block() : 0;
  }
  void* getBaseAllocation(void* ptr, std::size_t* size) override {
    if (CachingAllocator* a = allocator_owning(ptr))
      for (const SegmentSnapshot& s : a->snapshot())
        if (reinterpret_cast<std::uintptr_t>(ptr) >= s.address &&
            reinterpret_cast<std::uintptr_t>(ptr) < s.address + s.size) {
          *size = s.size;
          return reinterpret_cast<void*>(s.address);
        }
    TORCH_CHECK(false, "symmpool: ", ptr, " lies in no segment of a symmpool pool");
  }
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (!ptr.get() || ptr.get_deleter() != &free_block) return;  // not ours (a view of foreign memory)
    device_allocator(ptr.device().index()).record_stream(ptr.get(), driver_stream(stream.stream()));
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    DeviceStats out;
    out.max_split_size =
        static_cast<std::int64_t>(std::numeric_limits<std::size_t>::max());  // none, as torch
    CachingAllocator* a = existing_device_allocator(device);
    if (a == nullptr) return out;
    const AllocatorStats s = a->stats();
    const PoolStats &small = s.small_pool, &large = s.large_pool;
    copy_stats(out.allocation, s.active_blocks, small.active_blocks, large.active_blocks);
    copy_stats(out.segment, s.segments, small.segments, large.segments);
    copy_stats(out.allocated_bytes, s.allocated_bytes, small.allocated_bytes, large.allocated_bytes);
    copy_stats(out.reserved_bytes, s.reserved_bytes, small.reserved_bytes, large.reserved_bytes);
    copy_stats(out.requested_bytes, s.requested_bytes, small.requested_bytes, large.requested_bytes);
    // torch's "active" holds freed blocks whose streams' work is pending
    // too (symmpool's busy blocks); "inactive_split", free blocks of split segments.
    copy_stats(out.active, s.busy_blocks, small.busy_blocks, large.busy_blocks);
    copy_stats(out.active_bytes, s.busy_bytes, small.busy_bytes, large.busy_bytes);
    copy_stats(out.inactive_split, s.inactive_split_blocks, small.inactive_split_blocks,
               large.inactive_split_blocks);
    copy_stats(out.inactive_split_bytes, s.inactive_split_bytes, small.inactive_split_bytes,
               large.inactive_split_bytes);
    out.num_alloc_retries = static_cast<std::int64_t>(s.oom_retries);
    out.num_ooms = static_cast<std::int64_t>(s.ooms);
    out.num_device_alloc = static_cast<std::int64_t>(s.segment_maps);
    out.num_device_free = static_cast<std::int64_t>(s.segment_unmaps);
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    if (CachingAllocator* a = existing_device_allocator(device)) a->reset_accumulated_stats();
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    if (CachingAllocator* a = existing_device_allocator(device)) a->reset_peak_stats();
  }

  // The segments of every pool, or of private pool `id` alone.
  cca::SnapshotInfo snapshot(c10::MempoolId_t id, bool /*include_traces*/) override {
    cca::SnapshotInfo info;
    const int devices = c10::cuda::device_count();
    info.device_traces.resize(static_cast<std::size_t>(devices));  // no history is recorded
    for (int device = 0; device < devices; ++device) {
      CachingAllocator* a = existing_device_allocator(device);
      if (a == nullptr) continue;
      for (const SegmentSnapshot& s : a->snapshot()) {
        if (pool_id(id) != kDefaultPool && s.pool != pool_id(id)) continue;
        c10::CachingDeviceAllocator::SegmentInfo segment;
        segment.owner_private_pool_id = {s.pool.first, s.pool.second};
        segment.device = static_cast<c10::DeviceIndex>(device);
        segment.address = s.address;
        segment.total_size = s.size;
        segment.stream = s.stream;
        segment.is_large = !s.small;
        for (const BlockSnapshot& b : s.blocks) {
          c10::CachingDeviceAllocator::BlockInfo block;
          block.size = b.size;
          block.requested_size = b.requested;
          block.allocated = b.allocated;
          block.active = b.allocated || b.pending;
          segment.requested_size += b.requested;
          segment.allocated_size += b.allocated ? b.size : 0;
          segment.active_size += block.active ? b.size : 0;
          segment.blocks.push_back(block);
        }
        info.segments.push_back(std::move(segment));
      }
    }
    return info;
  }

  // Private pools: CUDA graphs, torch.cuda.MemPool, torch.compile's CUDA graph trees.
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override {
    device_allocator(device).begin_allocate_to_pool(pool_id(id), [filter = std::move(filter)](CUstream s) {
      return filter(reinterpret_cast<cudaStream_t>(s));
    });
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    device_allocator(device).end_allocate_to_pool(pool_id(id));
  }
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    device_allocator(device).release_pool(pool_id(id));
  }
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t id) override {
    return device_allocator(device).pool_use_count(pool_id(id));
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    if (allocator != nullptr)
      unsupported("a torch.cuda.MemPool with its own allocator", "symmpool's pools carve its own segments");
    device_allocator(device).create_or_incref_pool(pool_id(id));
  }
  void setUseOnOOM(c10::DeviceIndex /*device*/, c10::MempoolId_t /*id*/, bool use_on_oom) override {
    // ~MemPool() turns it off on every pool.
    if (use_on_oom)
      unsupported("a torch.cuda.MemPool used on out-of-memory", "its blocks serve its own allocations only");
  }
  void setNoSplit(c10::DeviceIndex /*device*/, c10::MempoolId_t /*id*/) override {
    unsupported("a torch.cuda.MemPool that does not split", "symmpool splits every pool's segments");
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t id,
                                const std::unordered_set<void*>& expected) override {
    return device_allocator(device).pool_live_allocations_are(pool_id(id), expected);
  }
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          c10::MempoolId_t id) override {
    return std::make_shared<PoolState>(device, device_allocator(device).checkpoint_pool(pool_id(id)));
  }
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> state) override {
    auto pool_state = std::dynamic_pointer_cast<PoolState>(state);
    TORCH_CHECK(pool_state != nullptr && pool_state->device == device,
                "symmpool: setCheckpointPoolState with a state symmpool did not take on device ", device);
    const PoolRestore restore = device_allocator(device).restore_pool(pool_state->checkpoint);
    cca::CheckpointDelta delta;
    delta.ptrs_freed = restore.freed;
    for (void* ptr : restore.allocated)
      delta.dataptrs_allocd.emplace_back(ptr, ptr, &free_block, c10::Device(c10::DeviceType::CUDA, device));
    return delta;
  }

  cca::ShareableHandle shareIpcHandle(void* /*ptr*/) override {
    unsupported("CUDA IPC (sharing CUDA tensors between processes)",
                "its memory is cuMem mappings, which cudaIpcGetMemHandle refuses");
  }
  std::shared_ptr<void> getIpcDevPtr(std::string /*handle*/) override {
    unsupported("CUDA IPC (sharing CUDA tensors between processes)",
                "its memory is cuMem mappings, which cudaIpcGetMemHandle refuses");
  }
  bool isHistoryEnabled() override { return false; }
  void recordHistory(bool enabled, cca::CreateContextFn, std::size_t, cca::RecordContext, bool,
                     const std::vector<std::string>&) override {
    if (enabled) unsupported("recording allocation history", "not implemented yet");
  }
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> lock(observers_mutex_);
    oom_observers_.push_back(std::move(observer));
  }
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker /*tracker*/) override {
    unsupported("allocator trace trackers", "not implemented yet");
  }
  void enablePeerAccess(c10::DeviceIndex, c10::DeviceIndex) override {
    unsupported("peer access between devices of one process",
                "its segments are mapped for their own device only");
  }
  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device, std::size_t count,
                          cudaStream_t stream, bool /*p2p_enabled*/) override {
    // Peer copies work without peer access to cuMem mappings.
    if (dst_device == src_device) return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
  }
  std::string name() override { return "symmpool"; }

 private:
  void* allocate_on(std::size_t bytes, c10::DeviceIndex device, cudaStream_t stream) {
    if (bytes == 0) return nullptr;
    try {
      return device_allocator(device).allocate(bytes, driver_stream(stream));
    } catch (const out_of_memory& e) {
      tell_observers(device);
      TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    }
  }

  void tell_observers(c10::DeviceIndex device) {
    std::vector<cca::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> lock(observers_mutex_);
      observers = oom_observers_;
    }
    if (observers.empty()) return;
    c10::cuda::CUDAGuard guard(device);
    std::size_t free = 0, total = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    CachingAllocator* a = existing_device_allocator(device);
    const auto allocated = a ? static_cast<std::size_t>(a->stats().allocated_bytes.current) : 0;
    for (auto& observer : observers) observer(device, allocated, total, free);
  }

  // Frees in the order of the stream the block was allocated on, as torch's
  // allocator does (record_stream names the other streams).
  static void free_block(void* ptr) {
    if (ptr == nullptr) return;
    CachingAllocator* a = allocator_owning(ptr);  // by address range: no allocator's lock taken twice
    TORCH_CHECK(a != nullptr, "symmpool: free of ", ptr, ", which no symmpool pool holds");
    a->deallocate_in_stream_order(ptr);
  }

  std::mutex observers_mutex_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
};

std::shared_ptr<ProcessAllocator>& installed() {
  static std::shared_ptr<ProcessAllocator> allocator;
  return allocator;
}

}  // namespace

void define_process_allocator(pybind11::module& m) {
  m.def(
      "_install_process_allocator",
      [] {
        if (installed()) return false;
        TORCH_CHECK(c10::cuda::device_count() > 0, "symmpool.install(): no CUDA device");
        TORCH_CHECK(!cca::get()->initialized(),
                    "symmpool.install() must come before the process's first CUDA allocation: torch's "
                    "CUDA allocator (",
                    cca::get()->name(),
                    ") already serves this process, and memory it handed out cannot move");
        auto allocator = std::make_shared<ProcessAllocator>();
        torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
        installed() = allocator;
        return true;
      },
      "Makes symmpool the process's CUDA allocator; False if it already is. Raises once torch's own "
      "allocator has served an allocation.");
  m.def(
      "_process_allocator_installed", [] { return static_cast<bool>(installed()); },
      "Whether symmpool is the process's CUDA allocator.");
}

}  // namespace symmpool::torch_ext
