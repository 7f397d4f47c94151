#pragma once
// c10d backend "symm", its c10d side: a ProcessGroupNCCL whose
// allocate_tensor hands out symmpool memory registered with the group's NCCL
// communicator (registration hooks per device), whose splits are "symm"
// groups too, and which builds the group's symmetric heap and communicator on
// the first collective that may run on symmpool. Which engine runs each
// all-gather, reduce-scatter and all-reduce is the router's call
// (collective_router.hpp); the rest, and whatever the router hands back,
// runs on NCCL. A failed symmpool collective fails the group for good: every
// later collective raises its error.

#include "c10d/collective_router.hpp"
#include "c10d/peer_group.hpp"

#include <symmpool/collective_options.hpp>
#include <symmpool/detail/failure_record.hpp>
#include <symmpool/nccl_registration.hpp>
#include <symmpool/nccl_windows.hpp>
#include <symmpool/symmetric_group.hpp>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace symmpool::torch_ext {

class SymmBackend final : public c10d::ProcessGroupNCCL, public PeerGroup {
 public:
  SymmBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
              c10::intrusive_ptr<Options> options);
  ~SymmBackend() override;

  const std::string getBackendName() const override { return "symm"; }
  // The pieces of a split "symm" group (DeviceMesh dimensions,
  // dist.split_group) are "symm" groups too.
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  bool supportsTensorAlloc(c10::DeviceIndex device) override;
  // FSDP2's comm buffers (set_allocate_memory_from_process_group_for_comm):
  // symmpool memory, except on the default stream when symmpool runs none of
  // the group's collectives (SYMMPOOL_COLLECTIVES=0), where PyTorch's cache
  // serves them at no extra memory.
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;
  // Always symmpool memory, registered with the group's NCCL communicator.
  at::Tensor allocate_symmetric(long size, at::TensorOptions options) override;

  // The communicator of a device exists only after its first collective (or
  // an eager connect): registration starts then, for existing segments too.
  void eagerConnectSingleDevice(at::Device device) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;

  // The functional all-reduce (torch.ops.symmpool.all_reduce): `output` =
  // every rank's `input` reduced, on the current stream, as a synchronous
  // call, without c10d's dispatcher and without a Work: where the router
  // picks symmpool the collective is already on the caller's stream, and
  // NCCL runs the others in place on `output`. False, and nothing run, where
  // TORCH_NCCL_BLOCKING_WAIT asks every call to block: the caller goes
  // through ProcessGroup::allreduce and its Work.
  // `opts` as the caller's synchronous call (asyncOp false).
  bool all_reduce_now(at::Tensor& output, at::Tensor& input, const c10d::AllreduceOptions& opts);

  // Deregister before the communicators go away.
  void shutdown() override;
  void abort() override;

  RegistrationCounts registration_counts() const;
  WindowCounts window_counts() const;
  // PeerGroup: the communicator for the peer-memory API and the fused ops
  // is the one the routed collectives use.
  Communicator* peer_memory(c10::DeviceIndex device) override;
  bool peer_memory_formed() const override { return group_ != nullptr || spans_nodes_; }
  int group_rank() const override { return getRank(); }
  int group_size() const override { return getSize(); }

 private:
  void register_if_ready(const at::Device& device);
  void register_locally(const at::Device& device);  // under mutex_: the device's NcclRegistrationHook
  // Collective: once the group's heap and NCCL communicator both exist (at
  // the same call on every rank), its symmetric segments become NCCL
  // windows where every rank can have them (nccl_windows.hpp), or the
  // group goes on without, saying why once.
  void form_windows_if_ready(const at::Device& device);
  template <typename F>
  c10::intrusive_ptr<c10d::Work> registering(const at::Device& device, F run);
  void detach_all() noexcept;
  void abandon_registrations() noexcept;    // detach without deregistering (abort)
  void release_symmetric_state() noexcept;  // communicator, heap, registrations
  void raise_if_failed() const;             // the group's sticky failure, if any

  // The group's communicator, made on the first call the router may send to
  // symmpool (collective: every rank gets there together); null, on every
  // rank, when the group spans nodes.
  Communicator* communicator(c10::DeviceIndex device);
  // The call's Work when the router ran it on symmpool; null when NCCL must.
  c10::intrusive_ptr<c10d::Work> on_symmpool(CollectiveKind kind, at::Tensor& output, at::Tensor& input,
                                             c10d::ReduceOp::RedOpType op, c10d::OpType type, Engine* engine);
  // NCCL's part of a call: `run(inputs, outputs)` enqueues it. Window memory
  // reaches NCCL only on Engine::kNcclWindows (checked by the router);
  // otherwise the call's window tensors are staged outside the windows.
  template <typename F>
  c10::intrusive_ptr<c10d::Work> on_nccl(Engine engine, const std::vector<at::Tensor>& inputs,
                                         const std::vector<at::Tensor>& outputs, c10d::OpType type, F run);

  mutable std::mutex mutex_;
  std::map<c10::DeviceIndex, std::unique_ptr<NcclRegistrationHook>> hooks_;
  bool aborted_ = false;  // under mutex_: no hook for NCCL's aborted communicator

  CollectiveRouter router_;
  // Read with SYMMPOOL_COLLECTIVES, when the backend is made: groups made
  // under different settings keep theirs (benchmarks compare algorithms so).
  const CollectiveOptions collective_options_;
  c10::intrusive_ptr<c10d::Store> store_for_heap_;
  std::unique_ptr<Store> heap_store_;
  std::unique_ptr<SymmetricGroup> group_;                  // made by the first call that may run on symmpool
  const bool windows_enabled_;                             // SYMMPOOL_NCCL_WINDOWS, as read when made
  bool windows_decided_ = false;                           // form_windows_if_ready made them or gave up
  std::unique_ptr<NcclWindows> windows_;                   // goes before group_, whose heap it observes
  std::atomic<const NcclWindows*> windows_view_{nullptr};  // what the router reads, from any thread
  c10::DeviceIndex heap_device_ = -1;
  bool spans_nodes_ = false;    // found when the heap formed: every call goes to NCCL
  bool blocking_wait_ = false;  // TORCH_NCCL_BLOCKING_WAIT: wait() blocks the host
  std::shared_ptr<const detail::FailureRecord> failure_;  // the communicator's, kept after it goes
};

// Sum of the registration counts of every live symm backend of this process.
RegistrationCounts registration_counts_of_all_backends();
WindowCounts window_counts_of_all_backends();

// The group's backend for CUDA, or null where it has none.
c10::intrusive_ptr<c10d::Backend> cuda_backend_of(c10d::ProcessGroup& group);
// The group's "symm" backend for CUDA, or null.
c10::intrusive_ptr<c10d::Backend> symm_backend_of(c10d::ProcessGroup& group);

}  // namespace symmpool::torch_ext
