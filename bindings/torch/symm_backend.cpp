#include "symm_backend.hpp"

#include "torch_errors.hpp"

#include <symmpool/device_allocators.hpp>

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdio>
#include <set>

namespace symmpool::torch_ext {

namespace {

std::mutex live_backends_mutex;
std::set<const SymmBackend*> live_backends;

}  // namespace

SymmBackend::SymmBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         c10::intrusive_ptr<Options> options)
    : ProcessGroupNCCL(store, rank, size, std::move(options)) {
  std::lock_guard<std::mutex> lock(live_backends_mutex);
  live_backends.insert(this);
}

SymmBackend::~SymmBackend() {
  detach_all();
  std::lock_guard<std::mutex> lock(live_backends_mutex);
  live_backends.erase(this);
}

bool SymmBackend::supportsTensorAlloc(c10::DeviceIndex device) {
  return device >= 0 && device < c10::cuda::device_count();
}

at::Tensor SymmBackend::allocateTensor(long size, at::TensorOptions options) {
  TORCH_CHECK(size >= 0, "symm allocate_tensor: size must be >= 0, got ", size);
  TORCH_CHECK(options.device().is_cuda(),
              "symm allocate_tensor: only CUDA tensors can come from symmpool, got device ",
              options.device());
  const c10::DeviceIndex device =
      options.device().has_index() ? options.device().index() : c10::cuda::current_device();
  TORCH_CHECK(supportsTensorAlloc(device), "symm allocate_tensor: no CUDA device ", int(device));
  options = options.device(at::Device(at::kCUDA, device));
  const std::size_t bytes = static_cast<std::size_t>(size) * options.dtype().itemsize();
  if (bytes == 0) return at::empty({size}, options);

  c10::cuda::CUDAGuard guard(device);
  register_if_ready(at::Device(at::kCUDA, device));
  auto stream = reinterpret_cast<CUstream>(c10::cuda::getCurrentCUDAStream(device).stream());
  void* ptr = call_translating_errors([&] { return device_allocator(device).allocate(bytes, stream); });
  // Freed in stream order on the allocating stream, as PyTorch's allocator does.
  auto deleter = [device, stream](void* p) {
    try {
      device_allocator(device).deallocate(p, stream);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "symmpool: freeing a symm tensor failed: %s\n", e.what());
    }
  };
  return at::from_blob(ptr, {size}, deleter, options);
}

void SymmBackend::register_if_ready(const at::Device& device) {
  if (!device.is_cuda()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (hooks_.count(device.index())) return;
  if (!getNCCLComm(std::to_string(device.index()))) return;  // no collective on it yet
  // getCommPtr reads the communicator of the current device.
  c10::cuda::CUDAGuard guard(device.index());
  auto comm = reinterpret_cast<ncclComm_t>(getCommPtr());
  auto hook = std::make_unique<NcclRegistrationHook>(comm);
  call_translating_errors([&] {
    device_allocator(device.index()).add_observer(hook.get(), /*replay_existing=*/true);
    return 0;
  });
  hooks_.emplace(device.index(), std::move(hook));
}

void SymmBackend::detach_all() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [device, hook] : hooks_) {
    try {
      device_allocator(device).remove_observer(hook.get(), /*replay_existing=*/true);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "symmpool: detaching from device %d failed: %s\n", int(device), e.what());
    }
  }
  hooks_.clear();
}

RegistrationCounts SymmBackend::registration_counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  RegistrationCounts total;
  for (auto& [device, hook] : hooks_) total += hook->counts();
  return total;
}

RegistrationCounts registration_counts_of_all_backends() {
  std::lock_guard<std::mutex> lock(live_backends_mutex);
  RegistrationCounts total;
  for (const SymmBackend* b : live_backends) total += b->registration_counts();
  return total;
}

void SymmBackend::eagerConnectSingleDevice(at::Device device) {
  ProcessGroupNCCL::eagerConnectSingleDevice(device);
  register_if_ready(device);
}

// Each collective registers before (the communicator may exist already) and
// after (its first collective created it).
c10::intrusive_ptr<c10d::Work> SymmBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "symm allreduce: no tensors");
  register_if_ready(tensors[0].device());
  auto work = ProcessGroupNCCL::allreduce(tensors, opts);
  register_if_ready(tensors[0].device());
  return work;
}

c10::intrusive_ptr<c10d::Work> SymmBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions& opts) {
  register_if_ready(input.device());
  auto work = ProcessGroupNCCL::_allgather_base(output, input, opts);
  register_if_ready(input.device());
  return work;
}

c10::intrusive_ptr<c10d::Work> SymmBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(!inputs.empty(), "symm allgather_into_tensor_coalesced: no tensors");
  register_if_ready(inputs[0].device());
  auto work = ProcessGroupNCCL::allgather_into_tensor_coalesced(outputs, inputs, opts);
  register_if_ready(inputs[0].device());
  return work;
}

c10::intrusive_ptr<c10d::Work> SymmBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  register_if_ready(input.device());
  auto work = ProcessGroupNCCL::_reduce_scatter_base(output, input, opts);
  register_if_ready(input.device());
  return work;
}

c10::intrusive_ptr<c10d::Work> SymmBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(!inputs.empty(), "symm reduce_scatter_tensor_coalesced: no tensors");
  register_if_ready(inputs[0].device());
  auto work = ProcessGroupNCCL::reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  register_if_ready(inputs[0].device());
  return work;
}

void SymmBackend::shutdown() {
  detach_all();
  ProcessGroupNCCL::shutdown();
}

void SymmBackend::abort() {
  detach_all();
  ProcessGroupNCCL::abort();
}

}  // namespace symmpool::torch_ext
