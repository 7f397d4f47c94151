#pragma once
// symmpool under a process group whose CUDA backend is not "symm" (a plain
// "nccl" group, a DeviceMesh dimension, the default group): its heap and
// communicator form on first use over the group's own store, one per group
// and device, over the same per-device cache as every other group's. Its
// all-gather, reduce-scatter and all-reduce run where the router sends them:
// on symmpool (a Work comes back), or, where it says NCCL, the caller runs
// the group's own collective on the same tensors. Its segments are not
// registered with the group's NCCL communicator: the group's own teardown
// (dist.destroy_process_group) frees that communicator without telling us.
// It serves the peer-memory API and the fused ops too (peer_group.hpp).

#include "c10d/collective_router.hpp"
#include "c10d/group_formation.hpp"
#include "c10d/peer_group.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <mutex>
#include <string>

namespace symmpool::torch_ext {

class GroupSymmetry final : public PeerGroup {
 public:
  // `nccl`: the group's CUDA backend; `store`: the group's own store.
  GroupSymmetry(c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl, c10::intrusive_ptr<c10d::Store> store);
  ~GroupSymmetry() override;

  // The call's Work where symmpool ran it on the current stream; null where
  // NCCL must run it (the router's decision, the same on every rank).
  c10::intrusive_ptr<c10d::Work> all_gather(at::Tensor& output, at::Tensor& input);
  c10::intrusive_ptr<c10d::Work> reduce_scatter(at::Tensor& output, at::Tensor& input,
                                                c10d::ReduceOp::RedOpType op);
  c10::intrusive_ptr<c10d::Work> all_reduce(at::Tensor& tensor, c10d::ReduceOp::RedOpType op);

  // The group's communicator on `device`, formed here (collective) if need
  // be; null, on every rank, where the group spans nodes.
  Communicator* communicator(c10::DeviceIndex device);
  const c10d::ProcessGroupNCCL& backend() const { return *nccl_; }

  // PeerGroup. Its tensors are symmpool memory, not registered with NCCL.
  Communicator* peer_memory(c10::DeviceIndex device) override;
  bool peer_memory_formed() const override { return formed_.group != nullptr || spans_nodes_; }
  at::Tensor allocate_symmetric(long size, at::TensorOptions options) override;
  int group_rank() const override { return nccl_->getRank(); }
  int group_size() const override { return nccl_->getSize(); }

 private:
  c10::intrusive_ptr<c10d::Work> run(CollectiveKind kind, at::Tensor& output, at::Tensor& input,
                                     c10d::ReduceOp::RedOpType op, c10d::OpType type);

  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl_;
  c10::intrusive_ptr<c10d::Store> store_;
  CollectiveRouter router_;
  const CollectiveOptions collective_options_;
  FormedGroup formed_;
  c10::DeviceIndex device_ = -1;
  bool spans_nodes_ = false;
  std::shared_ptr<const detail::FailureRecord> failure_;
};

// The group's (by name), made on first use over the group's own store; one
// per process group and device. A new group under a released or destroyed
// one's name gets a new one. Raises where the group's CUDA backend is not
// ProcessGroupNCCL.
std::shared_ptr<GroupSymmetry> group_symmetry(const std::string& group_name, c10::DeviceIndex device);
std::shared_ptr<GroupSymmetry> group_symmetry(c10d::ProcessGroup& group, c10::DeviceIndex device);
// Drops the group's heap, communicator and fused-op workspaces (they drain
// the device first); false where it had none.
bool release_group_symmetry(const std::string& group_name);

}  // namespace symmpool::torch_ext
