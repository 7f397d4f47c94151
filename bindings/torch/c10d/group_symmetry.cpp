#include "c10d/group_symmetry.hpp"

#include "c10d/group_teardown.hpp"
#include "c10d/symm_work.hpp"
#include "c10d/symmetric_tensor.hpp"
#include "torch_errors.hpp"

#include <symmpool/device_allocators.hpp>
#include <symmpool/log.hpp>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <cstdio>
#include <map>
#include <utility>
#include <vector>

namespace symmpool::torch_ext {

namespace {

// A plain group makes no NCCL windows (its NCCL calls are not the router's
// to check), so its router never routes to them.
RoutingSettings without_windows() {
  RoutingSettings settings = RoutingSettings::from_process();
  settings.nccl_windows = false;
  return settings;
}

struct Registry {
  std::mutex mutex;
  std::map<std::pair<std::string, c10::DeviceIndex>, std::shared_ptr<GroupSymmetry>> groups;
};

Registry& registry() {
  static auto* r = new Registry;  // never destroyed: groups go with destroy_process_group
  return *r;
}

}  // namespace

GroupSymmetry::GroupSymmetry(c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl,
                             c10::intrusive_ptr<c10d::Store> store)
    : nccl_(std::move(nccl)),
      store_(std::move(store)),
      router_(
          *nccl_, without_windows(), /*nccl_windows_enabled=*/false,
          [this](c10::DeviceIndex device) { return communicator(device); },
          [] { return static_cast<const NcclWindows*>(nullptr); }),
      collective_options_(call_translating_errors([] { return CollectiveOptions::from_environment(); })) {}

GroupSymmetry::~GroupSymmetry() {
  formed_.group.reset();         // the communicator (it drains the device), then its heap
  run_group_teardown(serial());  // after that drain: nothing queued can still use what goes
}

Communicator* GroupSymmetry::peer_memory(c10::DeviceIndex device) {
  if (failure_ && failure_->failed()) TORCH_CHECK(false, failure_->message());
  c10::cuda::CUDAGuard guard(device);
  return communicator(device);
}

at::Tensor GroupSymmetry::allocate_symmetric(long size, at::TensorOptions options) {
  return empty_symmetric(size, options);
}

Communicator* GroupSymmetry::communicator(c10::DeviceIndex device) {
  if (spans_nodes_) return nullptr;
  if (formed_.group) {
    TORCH_CHECK(device == device_,
                "symmpool collectives use one device per process group: this group's heap is "
                "on cuda:",
                int(device_), ", got cuda:", int(device));
    return &formed_.group->communicator();
  }
  if (failure_ && failure_->failed()) TORCH_CHECK(false, failure_->message());
  GroupFormation formation;
  formation.group = nccl_.get();
  formation.store = store_;
  formation.device = device;
  formation.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(nccl_->getOptions()->timeout);
  formation.collectives = collective_options_;
  formation.same_on_every_rank = {{"SYMMPOOL_COLLECTIVES", to_string(router_.settings())}};
  formed_ = form_symmetric_group(formation, &failure_);
  device_ = device;
  spans_nodes_ = formed_.group == nullptr;
  return spans_nodes_ ? nullptr : &formed_.group->communicator();
}

c10::intrusive_ptr<c10d::Work> GroupSymmetry::run(CollectiveKind kind, at::Tensor& output, at::Tensor& input,
                                                  c10d::ReduceOp::RedOpType op, c10d::OpType type) {
  if (failure_ && failure_->failed()) TORCH_CHECK(false, failure_->message());
  const RouteDecision decision = router_.route(kind, output, input, op);
  if (decision.engine != Engine::kSymmpool) return nullptr;
  Communicator& comm = formed_.group->communicator();
  return c10::make_intrusive<SymmWork>(std::vector<at::Tensor>{output}, type, comm.issued(),
                                       c10::cuda::getCurrentCUDAStream(output.device().index()),
                                       comm.take_end_of_last_call(), failure_, /*blocking_wait=*/false);
}

c10::intrusive_ptr<c10d::Work> GroupSymmetry::all_gather(at::Tensor& output, at::Tensor& input) {
  return run(CollectiveKind::kAllGather, output, input, c10d::ReduceOp::SUM, c10d::OpType::_ALLGATHER_BASE);
}

c10::intrusive_ptr<c10d::Work> GroupSymmetry::reduce_scatter(at::Tensor& output, at::Tensor& input,
                                                             c10d::ReduceOp::RedOpType op) {
  return run(CollectiveKind::kReduceScatter, output, input, op, c10d::OpType::_REDUCE_SCATTER_BASE);
}

c10::intrusive_ptr<c10d::Work> GroupSymmetry::all_reduce(at::Tensor& tensor, c10d::ReduceOp::RedOpType op) {
  return run(CollectiveKind::kAllReduce, tensor, tensor, op, c10d::OpType::ALLREDUCE);
}

std::shared_ptr<GroupSymmetry> group_symmetry(const std::string& group_name, c10::DeviceIndex device) {
  return group_symmetry(*c10d::resolve_process_group(group_name), device);
}

std::shared_ptr<GroupSymmetry> group_symmetry(c10d::ProcessGroup& group, c10::DeviceIndex device) {
  const std::string& group_name = group.getGroupName();
  auto backend = group.getBackend(c10::DeviceType::CUDA);
  auto nccl = c10::dynamic_intrusive_pointer_cast<c10d::ProcessGroupNCCL>(backend);
  TORCH_CHECK(nccl, "symmpool: group ", group_name, "'s CUDA backend is ", backend->getBackendName(),
              ", not NCCL");
  std::shared_ptr<GroupSymmetry> replaced;  // released outside the lock: it drains the device
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto& slot = r.groups[{group_name, device}];
  // A GroupSymmetry holds its backend, so a live one's address is never a
  // new group's: another address means another group under the same name.
  if (slot && &slot->backend() != nccl.get()) replaced = std::move(slot);
  if (!slot) slot = std::make_shared<GroupSymmetry>(std::move(nccl), group.getStore());
  return slot;
}

bool release_group_symmetry(const std::string& group_name) {
  std::vector<std::shared_ptr<GroupSymmetry>> gone;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (auto it = r.groups.begin(); it != r.groups.end();)
      if (it->first.first == group_name) {
        gone.push_back(std::move(it->second));
        it = r.groups.erase(it);
      } else {
        ++it;
      }
  }
  return !gone.empty();  // released here, outside the registry's lock: each drains the device
}

}  // namespace symmpool::torch_ext
