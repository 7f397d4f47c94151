// The collectives' kernels loaded at a communicator's setup rather than at
// their first launch (kernels.hpp says why).

#include "kernels.hpp"

#include <symmpool/log.hpp>

#include <mutex>
#include <set>

namespace symmpool::detail {

void load_collective_kernels(int device) {
  static std::mutex mutex;
  static std::set<int> loaded;  // devices whose context has them
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded.count(device) != 0) return;
  for (cudaError_t (*load)() :
       {load_barrier_kernels, load_reduce_kernels, load_gather_kernels, load_low_latency_kernels}) {
    if (cudaError_t e = load(); e != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: the launches report their own errors
      SYMMPOOL_WARN(kColl,
                    "loading the collective kernels on device %d failed (%s): they load at first launch",
                    device, cudaGetErrorString(e));
      return;
    }
  }
  loaded.insert(device);
}

}  // namespace symmpool::detail
