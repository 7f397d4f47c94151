#pragma once
// How a process group's symmetric heap and communicator form, for the "symm"
// backend and for any other group (group_symmetry.hpp): a collective over
// the group's own store, every wait within the group's timeout, failures
// handled as ProcessGroupNCCL's watchdog handles NCCL's
// (TORCH_NCCL_ASYNC_ERROR_HANDLING).

#include <symmpool/collective_options.hpp>
#include <symmpool/detail/failure_record.hpp>
#include <symmpool/store.hpp>
#include <symmpool/symmetric_group.hpp>

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace symmpool::torch_ext {

struct GroupFormation {
  const c10d::Backend* group = nullptr;  // its rank, size and uid (the heap's name)
  c10::intrusive_ptr<c10d::Store> store;
  c10::DeviceIndex device = -1;
  std::chrono::milliseconds timeout{0};  // the group's
  CollectiveOptions collectives;
  // Settings every rank must share, compared as the group forms.
  std::vector<std::pair<std::string, std::string>> same_on_every_rank;
};

struct FormedGroup {
  std::unique_ptr<Store> store;           // the heap's view of the c10d store: outlives `group`
  std::unique_ptr<SymmetricGroup> group;  // null where the ranks span nodes (warned once)
};

// Collective: every rank of the group calls it at the same point. Where it
// fails, `*failure` gets the sticky record (the group is unusable) and the
// error is thrown again; on success, the communicator's record.
FormedGroup form_symmetric_group(const GroupFormation& formation,
                                 std::shared_ptr<const detail::FailureRecord>* failure);

}  // namespace symmpool::torch_ext
