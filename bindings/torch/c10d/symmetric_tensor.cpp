#include "c10d/symmetric_tensor.hpp"

#include "stream_capture.hpp"
#include "torch_errors.hpp"

#include <symmpool/device_allocators.hpp>
#include <symmpool/log.hpp>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdio>
#include <limits>
#include <map>
#include <mutex>

namespace symmpool::torch_ext {

namespace {

// Memory of tensors allocated during a CUDA graph capture, freed since: the
// graph's replays still use it, and symmpool cannot tell when the graph is
// gone (torch keeps a private pool per graph for this), so it stays out of
// the cache for the process's lifetime.
struct GraphHeld {
  std::mutex mutex;
  std::map<c10::DeviceIndex, std::size_t> bytes;
};

GraphHeld& graph_held() {
  static auto* held = new GraphHeld;  // never destroyed: a deleter may run during static destruction
  return *held;
}

void hold_for_graphs(c10::DeviceIndex device, std::size_t bytes) {
  GraphHeld& held = graph_held();
  std::lock_guard<std::mutex> lock(held.mutex);
  held.bytes[device] += bytes;
}

}  // namespace

// The CUDA device an allocate_tensor request names (the current one when it
// names none); raises for a negative size or a device that is not a GPU here.
c10::DeviceIndex requested_cuda_device(long size, const at::TensorOptions& options) {
  TORCH_CHECK(size >= 0, "symm allocate_tensor: size must be >= 0, got ", size);
  TORCH_CHECK(options.device().is_cuda(),
              "symm allocate_tensor: only CUDA tensors can come from symmpool, got device ",
              options.device());
  const c10::DeviceIndex device =
      options.device().has_index() ? options.device().index() : c10::cuda::current_device();
  TORCH_CHECK(device >= 0 && device < c10::cuda::device_count(), "symm allocate_tensor: no CUDA device ",
              int(device));
  return device;
}

std::size_t graph_held_bytes(c10::DeviceIndex device) {
  GraphHeld& held = graph_held();
  std::lock_guard<std::mutex> lock(held.mutex);
  auto it = held.bytes.find(device);
  return it == held.bytes.end() ? 0 : it->second;
}

at::Tensor empty_symmetric(long size, at::TensorOptions options) {
  const c10::DeviceIndex device = requested_cuda_device(size, options);
  options = options.device(at::Device(at::kCUDA, device));
  const std::size_t itemsize = options.dtype().itemsize();
  TORCH_CHECK(static_cast<std::size_t>(size) <= std::numeric_limits<std::size_t>::max() / itemsize,
              "symm allocate_tensor: ", size, " elements of ", itemsize, " bytes overflow a size");
  const std::size_t bytes = static_cast<std::size_t>(size) * itemsize;
  if (bytes == 0) return at::empty({size}, options);

  c10::cuda::CUDAGuard guard(device);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
  auto stream = reinterpret_cast<CUstream>(current.stream());
  const bool for_a_graph = is_capturing(current);
  void* ptr = call_translating_errors([&] { return device_allocator(device).allocate(bytes, stream); });
  // Freed in stream order on the allocating stream, as PyTorch's allocator
  // does; memory a graph captured stays with it (graph_held above).
  auto deleter = [device, stream, for_a_graph, bytes](void* p) {
    if (for_a_graph) {
      hold_for_graphs(device, bytes);
      return;
    }
    try {
      device_allocator(device).deallocate(p, stream);
    } catch (const std::exception& e) {
      SYMMPOOL_WARN(kAlloc, "freeing a symm tensor failed: %s", e.what());
    }
  };
  return at::from_blob(ptr, {size}, deleter, options);
}

}  // namespace symmpool::torch_ext
