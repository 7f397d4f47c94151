#pragma once
// Adds device, driver, CUDA, NCCL and torch versions to Google Benchmark's
// JSON context (it already records the date and host).

namespace symmpool::bench {

// Returns false (and adds "gpu": "none") when no GPU is visible.
bool add_gpu_context();

}  // namespace symmpool::bench
