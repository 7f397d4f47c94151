#include "process_group.hpp"

#include <cuda_runtime_api.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

namespace symmpool::test {

ncclComm_t init_nccl(int rank, int world, Rendezvous& rv, int timeout_seconds) {
  if (cudaSetDevice(rank) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
  if (rank == 0) {
    if (ncclGetUniqueId(&rv.id) != ncclSuccess) throw std::runtime_error("ncclGetUniqueId failed");
    __sync_synchronize();
    rv.ready = 1;
  } else {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
    while (!rv.ready) {
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("rank 0 never published the NCCL id");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    __sync_synchronize();
  }
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRank(&comm, world, rv.id, rank);
  if (r != ncclSuccess) throw std::runtime_error(std::string("ncclCommInitRank: ") + ncclGetErrorString(r));
  return comm;
}

}  // namespace symmpool::test
