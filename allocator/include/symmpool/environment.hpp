#pragma once
// The allocator's settings, from the environment (each layer reads its own:
// the collectives' in collective_options.hpp and collective_routing.hpp, the
// logger's in log.cpp; docs/configuration.md lists them all).

#include <cstddef>
#include <string>

namespace symmpool {

struct Environment {
  // Any of these set to a true value ("1", "true", "yes", "on") turns multicast off.
  bool nccl_nvls_disabled = false;             // NCCL_NVLS_ENABLE=0
  bool torch_symm_multicast_disabled = false;  // TORCH_SYMM_MEM_DISABLE_MULTICAST=1
  bool symmpool_multicast_disabled = false;    // SYMMPOOL_DISABLE_MULTICAST=1
  bool multicast_requested = false;            // SYMMPOOL_ENABLE_MULTICAST=1
  // SYMMPOOL_SEGMENT_MOVES=0: a segment serves only the stream it was
  // mapped for (CachingAllocator's move_idle_segments).
  bool segment_moves = true;

  // Reads the current process environment.
  static Environment from_process();

  bool multicast_disabled_by_env() const {
    return nccl_nvls_disabled || torch_symm_multicast_disabled || symmpool_multicast_disabled;
  }
};

}  // namespace symmpool
