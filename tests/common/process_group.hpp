#pragma once
// Runs one child process per GPU and collects their exit codes, with a
// deadline: a rank that hangs is killed and reported, never waited on forever.
// CUDA must not be initialized in the parent before fork, so the GPU count
// is asked in a throwaway child too.

#include <nccl.h>

#include <functional>
#include <string>

namespace symmpool::test {

// GPUs visible to a fresh process (the parent stays CUDA-free).
int count_gpus_in_child();

// In a TEST body: sets `gpus` to count_gpus_in_child(), or skips the test
// with the reason when there are fewer than `need`.
#define SYMMPOOL_GPUS_OR_SKIP(gpus, need)                   \
  const int gpus = ::symmpool::test::count_gpus_in_child(); \
  if (gpus < (need)) GTEST_SKIP() << "needs " << (need) << " or more CUDA GPUs, this machine has " << gpus

// SYMMPOOL_TEST_RANKS_SHARE_GPU=1 (tests only: the heap then lets ranks on
// one GPU form) runs a multi-GPU test with every rank on GPU 0, so its
// 2-rank paths run on a 1-GPU machine (timings there mean nothing).
bool ranks_share_gpu();
// The GPU `rank` uses: its own, or GPU 0 when ranks share it.
int device_of_rank(int rank);

// As SYMMPOOL_GPUS_OR_SKIP, but one GPU is enough when ranks share it.
#define SYMMPOOL_GPUS_OR_SHARED_OR_SKIP(gpus, need)                                                   \
  const int gpus = ::symmpool::test::count_gpus_in_child();                                           \
  if (gpus < (need) && !(gpus >= 1 && ::symmpool::test::ranks_share_gpu()))                           \
  GTEST_SKIP() << "needs " << (need) << " or more CUDA GPUs (or SYMMPOOL_TEST_RANKS_SHARE_GPU=1 and " \
               << "one), this machine has " << gpus

// A directory for the FileStore of every rank this test binary forks, made
// on the first call (call it in the parent before run_ranks) and removed
// when the parent exits.
std::string shared_store_dir();

// Shared with the children: the NCCL unique id rank 0 publishes.
struct Rendezvous {
  volatile int ready;
  ncclUniqueId id;
};

// Forks `world` children running body(rank, world, rendezvous); returns
// "" when every child exits 0, else a description of who failed or hung.
std::string run_ranks(int world, int timeout_seconds,
                      const std::function<int(int rank, int world, Rendezvous& rv)>& body);

// Inside a child: rank 0 makes the NCCL id, the others wait for it (up to
// timeout_seconds), then all create the communicator on device `rank`.
ncclComm_t init_nccl(int rank, int world, Rendezvous& rv, int timeout_seconds);

}  // namespace symmpool::test
