#pragma once
// Tensors in symmpool's memory (the device's caching allocator, whose
// segments the groups' heaps share), freed in stream order on the stream
// that allocated them, as PyTorch's allocator frees: what the "symm"
// backend's allocate_tensor and the FSDP2 hooks' allocate hand out.

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstddef>

namespace symmpool::torch_ext {

// The CUDA device a request names (the current one when it names none);
// raises for a negative size or a device that is not a GPU here.
c10::DeviceIndex requested_cuda_device(long size, const at::TensorOptions& options);

// `size` elements of `options`' dtype on its CUDA device, from symmpool.
// Memory allocated during a CUDA graph capture stays with the graph
// (graph_held_bytes) once freed.
at::Tensor empty_symmetric(long size, at::TensorOptions options);

// Bytes of symmpool tensors allocated during a CUDA graph capture and freed
// since, kept out of the cache for the graphs that may replay on them.
std::size_t graph_held_bytes(c10::DeviceIndex device);

}  // namespace symmpool::torch_ext
