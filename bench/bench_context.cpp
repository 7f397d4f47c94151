#include "bench_context.hpp"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <fstream>
#include <string>

namespace symmpool::bench {

namespace {
std::string version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }
// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04 ..." -> the line.
std::string kernel_driver() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line;
  return std::getline(f, line) ? line : "unknown";
}

}  // namespace

bool add_gpu_context() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    benchmark::AddCustomContext("gpu", "none");
    return false;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int driver = 0, runtime = 0, nccl = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  ncclGetVersion(&nccl);
  benchmark::AddCustomContext("gpu", prop.name);
  benchmark::AddCustomContext("gpu_count", std::to_string(count));
  benchmark::AddCustomContext("nvidia_driver", kernel_driver());
  benchmark::AddCustomContext("cuda_driver", version_string(driver));
  benchmark::AddCustomContext("cuda_runtime", version_string(runtime));
  benchmark::AddCustomContext("nccl", std::to_string(nccl / 10000) + "." +
                                          std::to_string((nccl / 100) % 100) + "." +
                                          std::to_string(nccl % 100));
#ifdef SYMMPOOL_TORCH_VERSION
  benchmark::AddCustomContext("torch", SYMMPOOL_TORCH_VERSION);
#else
  benchmark::AddCustomContext("torch", "not built");
#endif
  return true;
}

}  // namespace symmpool::bench
