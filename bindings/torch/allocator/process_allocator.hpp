#pragma once
// symmpool as the process's CUDA allocator (symmpool.install()): c10's
// CUDAAllocator interface over the per-device caching allocators, so that
// every CUDA tensor of the process, compute and communication alike, comes
// from one cache, and torch's memory API (memory_stats, memory_summary,
// memory_snapshot, empty_cache, record_stream, out-of-memory errors)
// reports symmpool's figures. What the interface asks that symmpool cannot
// honour yet (private pools, and with them CUDA graphs; IPC; allocation
// history) raises an error that names it.

#include <pybind11/pybind11.h>

namespace symmpool::torch_ext {

void define_process_allocator(pybind11::module& m);

}  // namespace symmpool::torch_ext
