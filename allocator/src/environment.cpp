#include <symmpool/env_reader.hpp>
#include <symmpool/environment.hpp>

namespace symmpool {

using env::is_false;
using env::is_true;

Environment Environment::from_process() {
  Environment env;
  env.nccl_nvls_disabled = is_false("NCCL_NVLS_ENABLE");
  env.torch_symm_multicast_disabled = is_true("TORCH_SYMM_MEM_DISABLE_MULTICAST");
  env.symmpool_multicast_disabled = is_true("SYMMPOOL_DISABLE_MULTICAST");
  env.multicast_requested = is_true("SYMMPOOL_ENABLE_MULTICAST");
  env.segment_moves = !is_false("SYMMPOOL_SEGMENT_MOVES");
  return env;
}

}  // namespace symmpool
