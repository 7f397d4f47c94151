#include "c10d/symm_backend.hpp"

#include "c10d/group_formation.hpp"
#include "c10d/group_teardown.hpp"
#include "c10d/symm_work.hpp"
#include "c10d/symmetric_tensor.hpp"
#include "c10d/window_staging.hpp"
#include "torch_errors.hpp"

#include <symmpool/detail/failure_record.hpp>
#include <symmpool/error.hpp>
#include <symmpool/log.hpp>

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>

namespace symmpool::torch_ext {

namespace {

std::mutex live_backends_mutex;
std::set<const SymmBackend*> live_backends;

bool blocking_wait() {
  const char* value = std::getenv("TORCH_NCCL_BLOCKING_WAIT");
  return value && (std::string(value) == "1" || std::string(value) == "true");
}

}  // namespace

SymmBackend::SymmBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         c10::intrusive_ptr<Options> options)
    : ProcessGroupNCCL(store, rank, size, std::move(options)),
      router_(
          *this, RoutingSettings::from_process(), nccl_windows_from_process(),
          [this](c10::DeviceIndex device) { return communicator(device); },
          [this] { return windows_view_.load(std::memory_order_acquire); }),
      collective_options_(call_translating_errors([] { return CollectiveOptions::from_environment(); })),
      store_for_heap_(store),
      windows_enabled_(nccl_windows_from_process()) {
  blocking_wait_ = blocking_wait();
  std::lock_guard<std::mutex> lock(live_backends_mutex);
  live_backends.insert(this);
}

// ProcessGroupNCCL::split would make the piece a plain ProcessGroupNCCL. The
// NCCL side is the same as its: ranks outside the piece join the parent's
// ncclCommSplit without a color, ranks inside split with one color per piece
// (its lowest rank; each rank is in one piece per split).
c10::intrusive_ptr<c10d::Backend> SymmBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::vector<int>& ranks,
                                                     const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  const c10::DeviceIndex index = guessDeviceId();
  TORCH_CHECK(index >= 0, "symm split: rank ", getRank(), " has no CUDA device bound to it");
  const at::Device device(at::DeviceType::CUDA, index);
  const auto me = std::find(ranks.begin(), ranks.end(), getRank());
  if (me == ranks.end()) {
    performNocolorSplit(device);
    return nullptr;
  }
  auto nccl_options = c10::dynamic_intrusive_pointer_cast<Options>(opts);
  TORCH_CHECK(nccl_options, "symm split: the options are not ProcessGroupNCCL.Options");
  const std::vector<std::uint64_t>& parent_globals =
      getOptions()->global_ranks_in_group;  // empty: the default group
  std::vector<std::uint64_t> global_ranks;
  for (int r : ranks)
    global_ranks.push_back(parent_globals.empty() ? static_cast<std::uint64_t>(r)
                                                  : parent_globals.at(static_cast<std::size_t>(r)));
  nccl_options->split_from = c10::intrusive_ptr<ProcessGroupNCCL>::unsafe_reclaim_from_nonowning(this);
  nccl_options->split_color = *std::min_element(ranks.begin(), ranks.end());
  nccl_options->global_ranks_in_group = std::move(global_ranks);
  auto piece = c10::make_intrusive<SymmBackend>(store->clone(), static_cast<int>(me - ranks.begin()),
                                                static_cast<int>(ranks.size()), nccl_options);
  piece->eagerConnectSingleDevice(device);
  return piece;
}

SymmBackend::~SymmBackend() {
  release_symmetric_state();
  std::lock_guard<std::mutex> lock(live_backends_mutex);
  live_backends.erase(this);
}

bool SymmBackend::supportsTensorAlloc(c10::DeviceIndex device) {
  return device >= 0 && device < c10::cuda::device_count();
}

at::Tensor SymmBackend::allocateTensor(long size, at::TensorOptions options) {
  // With SYMMPOOL_COLLECTIVES=0 NCCL runs every collective of the group, and
  // symmpool memory buys only NCCL's registration of the buffer. On the
  // default stream, where the model computes (FSDP2's reduce-scatter input),
  // a pool of its own costs more than that: PyTorch's cache there reuses
  // what the activations just freed, while symmpool's would hold the same
  // bytes on top (docs/fsdp2_flag_memory.md). Requests on other streams
  // (FSDP2's all-gather buffers and reduce-scatter outputs) stay registered.
  if (!router_.settings().enabled) {
    const c10::DeviceIndex device = requested_cuda_device(size, options);
    if (c10::cuda::getCurrentCUDAStream(device) == c10::cuda::getDefaultCUDAStream(device))
      return at::empty({size}, options.device(at::Device(at::kCUDA, device)));
  }
  return allocate_symmetric(size, options);
}

at::Tensor SymmBackend::allocate_symmetric(long size, at::TensorOptions options) {
  const c10::DeviceIndex device = requested_cuda_device(size, options);
  register_if_ready(at::Device(at::kCUDA, device));
  return empty_symmetric(size, options.device(at::Device(at::kCUDA, device)));
}

void SymmBackend::release_symmetric_state() noexcept {
  if (windows_) {
    windows_view_.store(nullptr, std::memory_order_release);
    // NCCL's kernels may still read through the windows: they finish first.
    if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
      SYMMPOOL_WARN(kReg, "device sync before deregistering NCCL windows failed: %s", cudaGetErrorString(e));
    windows_.reset();  // before the heap it observes
  }
  group_.reset();  // the communicator (it synchronizes the device), then the heap it maps through
  run_group_teardown(serial());  // after the device sync above: nothing queued can still use what goes
  detach_all();
}

RegistrationCounts registration_counts_of_all_backends() {
  std::lock_guard<std::mutex> lock(live_backends_mutex);
  RegistrationCounts total;
  for (const SymmBackend* b : live_backends) total += b->registration_counts();
  return total;
}

WindowCounts window_counts_of_all_backends() {
  std::lock_guard<std::mutex> lock(live_backends_mutex);
  WindowCounts total;
  for (const SymmBackend* b : live_backends) total += b->window_counts();
  return total;
}

void SymmBackend::eagerConnectSingleDevice(at::Device device) {
  ProcessGroupNCCL::eagerConnectSingleDevice(device);
  register_if_ready(device);
}

// Each collective registers before (the communicator may exist already) and
// after (its first collective created it).
template <typename F>
c10::intrusive_ptr<c10d::Work> SymmBackend::registering(const at::Device& device, F run) {
  raise_if_failed();  // sticky: NCCL-bound calls of a failed group raise too
  register_if_ready(device);
  auto work = run();
  register_if_ready(device);
  return work;
}

template <typename F>
c10::intrusive_ptr<c10d::Work> SymmBackend::on_nccl(Engine engine, const std::vector<at::Tensor>& inputs,
                                                    const std::vector<at::Tensor>& outputs, c10d::OpType type,
                                                    F run) {
  const NcclWindows* windows = windows_view_.load(std::memory_order_acquire);
  if (engine == Engine::kNcclWindows || windows == nullptr) {
    std::vector<at::Tensor> in = inputs, out = outputs;
    return run(in, out);
  }
  StagedOutsideWindows staged(windows, inputs, outputs);
  auto work = run(staged.inputs(), staged.outputs());
  return staged.finish(std::move(work), type, failure_, blocking_wait_);
}

c10::intrusive_ptr<c10d::Work> SymmBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "symm allreduce: no tensors");
  return registering(tensors[0].device(), [&]() -> c10::intrusive_ptr<c10d::Work> {
    Engine engine = Engine::kNccl;
    if (tensors.size() > 1)
      router_.route_several(CollectiveKind::kAllReduce, tensors);
    else if (auto work = on_symmpool(CollectiveKind::kAllReduce, tensors[0], tensors[0], opts.reduceOp,
                                     c10d::OpType::ALLREDUCE, &engine))
      return work;
    return on_nccl(engine, tensors, tensors, c10d::OpType::ALLREDUCE,
                   [&](std::vector<at::Tensor>&, std::vector<at::Tensor>& out) {
                     return ProcessGroupNCCL::allreduce(out, opts);
                   });
  });
}

bool SymmBackend::all_reduce_now(at::Tensor& output, at::Tensor& input, const c10d::AllreduceOptions& opts) {
  if (blocking_wait_) return false;
  c10::intrusive_ptr<c10d::Work> nccl_work =
      registering(input.device(), [&]() -> c10::intrusive_ptr<c10d::Work> {
        const Engine engine = router_.route(CollectiveKind::kAllReduce, output, input, opts.reduceOp).engine;
        if (engine == Engine::kSymmpool) {
          raise_if_failed();  // a failure found meanwhile, which SymmWork::wait() would raise
          return {};
        }
        output.copy_(input);
        return on_nccl(engine, {output}, {output}, c10d::OpType::ALLREDUCE,
                       [&](std::vector<at::Tensor>&, std::vector<at::Tensor>& out) {
                         return ProcessGroupNCCL::allreduce(out, opts);
                       });
      });
  if (nccl_work) nccl_work->wait();
  return true;
}

c10::intrusive_ptr<c10d::Work> SymmBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions& opts) {
  return registering(input.device(), [&]() -> c10::intrusive_ptr<c10d::Work> {
    Engine engine = Engine::kNccl;
    if (auto work = on_symmpool(CollectiveKind::kAllGather, output, input, c10d::ReduceOp::SUM,
                                c10d::OpType::_ALLGATHER_BASE, &engine))
      return work;
    return on_nccl(engine, {input}, {output}, c10d::OpType::_ALLGATHER_BASE,
                   [&](std::vector<at::Tensor>& in, std::vector<at::Tensor>& out) {
                     return ProcessGroupNCCL::_allgather_base(out[0], in[0], opts);
                   });
  });
}

c10::intrusive_ptr<c10d::Work> SymmBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(!inputs.empty(), "symm allgather_into_tensor_coalesced: no tensors");
  return registering(inputs[0].device(), [&] {
    router_.route_several(CollectiveKind::kAllGather, outputs);
    return on_nccl(Engine::kNccl, inputs, outputs, c10d::OpType::COALESCED,
                   [&](std::vector<at::Tensor>& in, std::vector<at::Tensor>& out) {
                     return ProcessGroupNCCL::allgather_into_tensor_coalesced(out, in, opts);
                   });
  });
}

c10::intrusive_ptr<c10d::Work> SymmBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::ReduceScatterOptions& opts) {
  return registering(input.device(), [&]() -> c10::intrusive_ptr<c10d::Work> {
    Engine engine = Engine::kNccl;
    if (auto work = on_symmpool(CollectiveKind::kReduceScatter, output, input, opts.reduceOp,
                                c10d::OpType::_REDUCE_SCATTER_BASE, &engine))
      return work;
    return on_nccl(engine, {input}, {output}, c10d::OpType::_REDUCE_SCATTER_BASE,
                   [&](std::vector<at::Tensor>& in, std::vector<at::Tensor>& out) {
                     return ProcessGroupNCCL::_reduce_scatter_base(out[0], in[0], opts);
                   });
  });
}

c10::intrusive_ptr<c10d::Work> SymmBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(!inputs.empty(), "symm reduce_scatter_tensor_coalesced: no tensors");
  return registering(inputs[0].device(), [&] {
    router_.route_several(CollectiveKind::kReduceScatter, inputs);
    return on_nccl(Engine::kNccl, inputs, outputs, c10d::OpType::COALESCED,
                   [&](std::vector<at::Tensor>& in, std::vector<at::Tensor>& out) {
                     return ProcessGroupNCCL::reduce_scatter_tensor_coalesced(out, in, opts);
                   });
  });
}

void SymmBackend::shutdown() {
  release_symmetric_state();
  ProcessGroupNCCL::shutdown();
}

void SymmBackend::abort() {
  // Barriers give up at once (a peer may be dead).
  if (group_) group_->communicator().abort("the process group was aborted");
  // NCCL aborts before symmpool's state goes, since releasing it waits for
  // the device, and an NCCL kernel stuck on a dead peer would hold that wait
  // forever. NCCL's abort frees its registrations of symmpool's segments
  // with the communicator, so the hooks first forget theirs (the
  // communicator they would call is gone after it) without taking the
  // allocator's lock, which a thread waiting on NCCL's work may hold; they
  // are detached with symmpool's state.
  abandon_registrations();
  ProcessGroupNCCL::abort();
  release_symmetric_state();
}

void SymmBackend::raise_if_failed() const {
  if (failure_ && failure_->failed()) TORCH_CHECK(false, failure_->message());
}

Communicator* SymmBackend::communicator(c10::DeviceIndex device) {
  if (spans_nodes_) return nullptr;
  if (group_) {
    TORCH_CHECK(device == heap_device_,
                "symm collectives use one device per process group: this "
                "group's heap is on cuda:",
                int(heap_device_), ", got cuda:", int(device));
    return &group_->communicator();
  }
  raise_if_failed();  // the heap did not form before: no second try
  // Collective: every rank reaches its first routed collective together.
  GroupFormation formation;
  formation.group = this;
  formation.store = store_for_heap_;
  formation.device = device;
  formation.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(getOptions()->timeout);
  formation.collectives = collective_options_;
  // Ranks that route a call to different engines would each wait for the
  // other in vain.
  formation.same_on_every_rank = {{"SYMMPOOL_COLLECTIVES", to_string(router_.settings())},
                                  {"SYMMPOOL_NCCL_WINDOWS", windows_enabled_ ? "1" : "0"}};
  FormedGroup formed = form_symmetric_group(formation, &failure_);
  heap_store_ = std::move(formed.store);
  if (!formed.group) {
    spans_nodes_ = true;
    return nullptr;
  }
  group_ = std::move(formed.group);
  heap_device_ = device;
  return &group_->communicator();
}

Communicator* SymmBackend::peer_memory(c10::DeviceIndex device) {
  raise_if_failed();
  c10::cuda::CUDAGuard guard(device);
  return communicator(device);
}

c10::intrusive_ptr<c10d::Work> SymmBackend::on_symmpool(CollectiveKind kind, at::Tensor& output,
                                                        at::Tensor& input, c10d::ReduceOp::RedOpType op,
                                                        c10d::OpType type, Engine* engine) {
  *engine = router_.route(kind, output, input, op).engine;
  if (*engine != Engine::kSymmpool) return nullptr;
  Communicator& comm = group_->communicator();
  return c10::make_intrusive<SymmWork>(std::vector<at::Tensor>{output}, type, comm.issued(),
                                       c10::cuda::getCurrentCUDAStream(output.device().index()),
                                       comm.take_end_of_last_call(), failure_, blocking_wait_);
}

c10::intrusive_ptr<c10d::Backend> cuda_backend_of(c10d::ProcessGroup& group) {
  const auto types = group.getDeviceTypes();
  if (std::find(types.begin(), types.end(), c10::Device(c10::DeviceType::CUDA)) == types.end()) return {};
  return group.getBackend(c10::DeviceType::CUDA);
}

c10::intrusive_ptr<c10d::Backend> symm_backend_of(c10d::ProcessGroup& group) {
  auto backend = cuda_backend_of(group);
  return dynamic_cast<SymmBackend*>(backend.get()) ? backend : c10::intrusive_ptr<c10d::Backend>();
}

}  // namespace symmpool::torch_ext
