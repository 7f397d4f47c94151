#pragma once
// c10d backend "symm": a ProcessGroupNCCL whose allocate_tensor hands out
// symmpool memory registered with the group's NCCL communicator, and whose
// all-gather, reduce-scatter and all-reduce run on symmpool's collectives
// where the algorithm table prefers them (NCCL otherwise, and for buffers
// that are not symmetric on every rank). A failed symmpool collective fails
// the group for good: every later collective raises its error.

#include <symmpool/algorithm_table.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/detail/failure_record.hpp>
#include <symmpool/nccl_registration.hpp>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace symmpool::torch_ext {

class SymmBackend final : public c10d::ProcessGroupNCCL {
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
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;

  // The communicator of a device exists only after its first collective (or
  // an eager connect): registration starts then, for existing segments too.
  void eagerConnectSingleDevice(at::Device device) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;

  // Deregister before the communicators go away.
  void shutdown() override;
  void abort() override;

  RegistrationCounts registration_counts() const;

 private:
  void register_if_ready(const at::Device& device);
  template <typename F>
  c10::intrusive_ptr<c10d::Work> registering(const at::Device& device, F run);
  void detach_all() noexcept;
  void release_symmetric_state() noexcept;  // communicator, heap, registrations
  void raise_if_failed() const;             // the group's sticky failure, if any
  c10::intrusive_ptr<c10d::Work> enqueued_work(const at::Tensor& output, c10d::OpType type);

  // symmpool's own collectives (unless SYMMPOOL_COLLECTIVES=0). Each returns null
  // when the call must go to NCCL: unsupported shape, dtype or op (decided
  // the same way on every rank), plain tensors (decided locally: SPMD
  // programs pass plain tensors on every rank), or buffers that are not
  // symmetric on every rank (decided by one exchange that every rank sees). communicator() is
  // null, on every rank, when the group spans nodes.
  Communicator* communicator(c10::DeviceIndex device);
  c10::intrusive_ptr<c10d::Work> try_all_gather(at::Tensor& output, at::Tensor& input);
  // Enqueues on the current stream; false (counted) when plain tensors, the
  // symmetry check or a group spanning nodes sent the call to NCCL.
  bool run_on_symmpool(const at::Tensor& output, const at::Tensor& input,
                       const std::function<void(Communicator&, cudaStream_t)>& enqueue);
  c10::intrusive_ptr<c10d::Work> try_reduce(at::Tensor& output, at::Tensor& input,
                                            c10d::ReduceOp op, bool scatter);

  mutable std::mutex mutex_;
  std::map<c10::DeviceIndex, std::unique_ptr<NcclRegistrationHook>> hooks_;

  bool collectives_enabled_ = false;
  bool collectives_always_ = false;  // ignore the algorithm table
  c10::intrusive_ptr<c10d::Store> store_for_heap_;
  std::unique_ptr<Store> heap_store_;
  std::unique_ptr<SymmetricHeap> heap_;
  std::unique_ptr<Communicator> comm_;
  c10::DeviceIndex heap_device_ = -1;
  bool spans_nodes_ = false;  // found when the heap formed: every call goes to NCCL
  bool blocking_wait_ = false;  // TORCH_NCCL_BLOCKING_WAIT: wait() blocks the host
  std::shared_ptr<const detail::FailureRecord> failure_;  // the communicator's, kept after it goes
};

// Collectives the symm backends of this process ran themselves, and calls
// they handed to NCCL after a symmetry check failed.
struct CollectiveCounts {
  std::uint64_t routed = 0;
  std::uint64_t fallbacks = 0;
};
CollectiveCounts collective_counts();

// Sum of the registration counts of every live symm backend of this process.
RegistrationCounts registration_counts_of_all_backends();

}  // namespace symmpool::torch_ext
