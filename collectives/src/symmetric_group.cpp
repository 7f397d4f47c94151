#include <symmpool/symmetric_group.hpp>

#include <utility>

namespace symmpool {

SymmetricGroup::SymmetricGroup(const DriverApi& driver, CachingAllocator& allocator, Store& store,
                               const std::string& name, int rank, int world, SymmetricGroupOptions options)
    : heap_(std::make_unique<SymmetricHeap>(driver, allocator, store, name, rank, world,
                                            HeapOptions{options.heap_timeout})) {
  // Before the communicator: ranks that differ leave nothing to tear down
  // (its destructor syncs the device, which a capture open on the caller's
  // thread would not survive).
  for (const auto& [setting, value] : options.same_on_every_rank) heap_->require_same_setting(setting, value);
  SymmetricHeap::DeviceWaitsForbidden no_waits(*heap_, options.forms_in_capture);
  communicator_ = std::make_unique<Communicator>(
      *heap_, allocator, options.barrier_timeout, std::move(options.on_failure),
      options.collectives ? *options.collectives : CollectiveOptions::from_environment());
}

}  // namespace symmpool
