#pragma once
// A group's symmetric memory and its collectives, assembled in the one order
// that works, in one place for every caller (the torch backend, the
// benchmarks, the tests): the heap over this device's caching allocator (a
// collective: every rank of the group forms it together through the store),
// then the communicator over the heap. The communicator goes first when the
// group does, before the heap it maps through.

#include <symmpool/caching_allocator.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/store.hpp>
#include <symmpool/symmetric_heap.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace symmpool {

struct SymmetricGroupOptions {
  // For every wait on a peer while the heap forms and syncs.
  std::chrono::milliseconds heap_timeout{std::chrono::seconds(120)};
  // For every barrier (SYMMPOOL_BARRIER_TIMEOUT overrides it).
  std::chrono::seconds barrier_timeout{Communicator::kDefaultBarrierTimeout};
  // Hears the communicator's failure once; stderr when empty.
  FailureHandler on_failure;
  // Tuning of the collectives; unset: read from the environment when the
  // group forms.
  std::optional<CollectiveOptions> collectives;
  // The caller's own settings that every rank must share, as (name, value)
  // (the torch backend's routing: ranks that route a call to different
  // engines wait for each other in vain). Compared when the group forms;
  // ranks that differ fail to form it, naming the setting and both values.
  std::vector<std::pair<std::string, std::string>> same_on_every_rank;
  // The group forms inside a CUDA graph capture (its first collective is
  // captured): its first sync must not wait for the device, which would end
  // the capture; peer mappings retired before wait for a later sync.
  bool forms_in_capture = false;
};

class SymmetricGroup {
 public:
  // Collective over the `world` ranks of `name`. Throws multi_node_error
  // (from the heap, on every rank) when the ranks span nodes, and what the
  // heap and the communicator throw otherwise; nothing is left behind.
  SymmetricGroup(const DriverApi& driver, CachingAllocator& allocator, Store& store, const std::string& name,
                 int rank, int world, SymmetricGroupOptions options = {});

  SymmetricHeap& heap() { return *heap_; }
  Communicator& communicator() { return *communicator_; }

 private:
  std::unique_ptr<SymmetricHeap> heap_;
  std::unique_ptr<Communicator> communicator_;  // declared after the heap: destroyed before it
};

}  // namespace symmpool
