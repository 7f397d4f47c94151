#pragma once
// Every environment variable symmpool reads is read here, in one place.

#include <cstddef>
#include <string>

namespace symmpool {

struct Environment {
  // Any of these set to a true value ("1", "true", "yes", "on") turns multicast off.
  bool nccl_nvls_disabled = false;             // NCCL_NVLS_ENABLE=0
  bool torch_symm_multicast_disabled = false;  // TORCH_SYMM_MEM_DISABLE_MULTICAST=1
  bool symmpool_multicast_disabled = false;    // SYMMPOOL_DISABLE_MULTICAST=1
  bool multicast_requested = false;            // SYMMPOOL_ENABLE_MULTICAST=1
  // The "symm" backend runs its own collectives on symmetric buffers where
  // the algorithm table prefers them (the default; world sizes it has no
  // measurements for stay on NCCL), on every call it can take with
  // SYMMPOOL_COLLECTIVES=always (tests), and never with SYMMPOOL_COLLECTIVES=0.
  bool collectives_enabled = true;
  bool collectives_always = false;
  // SYMMPOOL_COLLECTIVES=nccl-windows: every call it can take runs on NCCL
  // over its symmetric windows (tests and benchmarks), whatever the table says.
  bool collectives_nccl_windows = false;
  // SYMMPOOL_NCCL_WINDOWS=0: a "symm" group makes no NCCL windows of its
  // symmetric segments (they stay registered locally).
  bool nccl_windows = true;
  // SYMMPOOL_SEGMENT_MOVES=0: a segment serves only the stream it was
  // mapped for (CachingAllocator's move_idle_segments).
  bool segment_moves = true;
  // SYMMPOOL_DEBUG_ROUTING=1: the backend prints where each collective runs,
  // and why (the ROUTING subsystem at INFO, log.hpp).
  bool debug_routing = false;
  // SYMMPOOL_DEBUG: NONE, WARN, INFO or TRACE; SYMMPOOL_DEBUG_SUBSYS: the
  // subsystems printed (log.hpp); empty when unset.
  std::string debug_level;
  std::string debug_subsystems;
  // SYMMPOOL_MAX_BLOCKS: cap on the grid of reduction kernels too large to
  // meet their peers inside (they hold SMs that overlapping compute wants),
  // as NCCL_MAX_CTAS caps NCCL's; empty when unset, checked by the user.
  std::string max_blocks;
  // SYMMPOOL_COPY_STREAMS: streams that share each copy-engine copy (1..8).
  std::string copy_streams;
  // SYMMPOOL_BARRIER_TIMEOUT: seconds a barrier waits for a peer before it
  // gives up with an error (default 600, c10d's default for NCCL).
  std::string barrier_timeout;
  // SYMMPOOL_ALL_REDUCE_ALGORITHM: one-shot, two-shot, two-step or
  // low-latency, used where it can run instead of the algorithm table's
  // choice (as NCCL_ALGO); SYMMPOOL_REDUCE_SCATTER_ALGORITHM: one-shot or
  // two-step, the same for reduce-scatters.
  std::string all_reduce_algorithm;
  std::string reduce_scatter_algorithm;
  // SYMMPOOL_TWO_STEP_PIECE_BYTES: the most bytes of one rank's chunk that
  // the two-step algorithms move and reduce per pipeline step.
  std::string two_step_piece_bytes;
  // SYMMPOOL_FUSED_MAX_BYTES: the most bytes a reduction kernel reads from
  // each peer and still meets its peers inside one launch; larger ones run
  // between barrier kernels (the algorithm table's limit when unset).
  std::string fused_max_bytes;
  // SYMMPOOL_TP_ONE_SHOT_BYTES: the largest gathered A or product that a
  // fused tensor-parallel op moves in one step, with one matmul, rather
  // than pipelined shard by shard; empty when unset.
  std::string tp_one_shot_bytes;
  // SYMMPOOL_HOST_ID: this node's identity, like NCCL_HOSTID, where hostname
  // and boot id cannot tell nodes apart (tests use it to make one machine
  // look like several nodes); empty when unset.
  std::string host_id;
  // SYMMPOOL_TEST_RANKS_SHARE_GPU=1: a heap accepts ranks on one GPU, which
  // it refuses otherwise (as NCCL does). Tests only: it runs the 2-rank
  // paths on a 1-GPU machine (tests/python/launch.py run_sharing_one_gpu).
  bool test_ranks_share_gpu = false;

  // Reads the current process environment.
  static Environment from_process();

  bool multicast_disabled_by_env() const {
    return nccl_nvls_disabled || torch_symm_multicast_disabled || symmpool_multicast_disabled;
  }
};

}  // namespace symmpool
