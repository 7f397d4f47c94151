#include <symmpool/environment.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace symmpool {

namespace {

std::string lowered(const char* value) {
  std::string s = value ? value : "";
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool is_true(const char* name) {
  std::string v = lowered(std::getenv(name));
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

bool is_false(const char* name) {
  std::string v = lowered(std::getenv(name));
  return v == "0" || v == "false" || v == "no" || v == "off";
}

}  // namespace

Environment Environment::from_process() {
  Environment env;
  env.nccl_nvls_disabled = is_false("NCCL_NVLS_ENABLE");
  env.torch_symm_multicast_disabled = is_true("TORCH_SYMM_MEM_DISABLE_MULTICAST");
  env.symmpool_multicast_disabled = is_true("SYMMPOOL_DISABLE_MULTICAST");
  env.multicast_requested = is_true("SYMMPOOL_ENABLE_MULTICAST");
  env.collectives_always = lowered(std::getenv("SYMMPOOL_COLLECTIVES")) == "always";
  env.collectives_nccl_windows = lowered(std::getenv("SYMMPOOL_COLLECTIVES")) == "nccl-windows";
  env.collectives_enabled = !is_false("SYMMPOOL_COLLECTIVES");
  env.nccl_windows = !is_false("SYMMPOOL_NCCL_WINDOWS");
  env.debug_routing = is_true("SYMMPOOL_DEBUG_ROUTING");
  if (const char* v = std::getenv("SYMMPOOL_DEBUG")) env.debug_level = v;
  if (const char* v = std::getenv("SYMMPOOL_DEBUG_SUBSYS")) env.debug_subsystems = v;
  env.segment_moves = !is_false("SYMMPOOL_SEGMENT_MOVES");
  if (const char* v = std::getenv("SYMMPOOL_MAX_BLOCKS")) env.max_blocks = v;
  if (const char* v = std::getenv("SYMMPOOL_COPY_STREAMS")) env.copy_streams = v;
  if (const char* v = std::getenv("SYMMPOOL_BARRIER_TIMEOUT")) env.barrier_timeout = v;
  if (const char* v = std::getenv("SYMMPOOL_ALL_REDUCE_ALGORITHM")) env.all_reduce_algorithm = v;
  if (const char* v = std::getenv("SYMMPOOL_REDUCE_SCATTER_ALGORITHM")) env.reduce_scatter_algorithm = v;
  if (const char* v = std::getenv("SYMMPOOL_TWO_STEP_PIECE_BYTES")) env.two_step_piece_bytes = v;
  if (const char* v = std::getenv("SYMMPOOL_FUSED_MAX_BYTES")) env.fused_max_bytes = v;
  if (const char* v = std::getenv("SYMMPOOL_TP_ONE_SHOT_BYTES")) env.tp_one_shot_bytes = v;
  if (const char* v = std::getenv("SYMMPOOL_HOST_ID")) env.host_id = v;
  env.test_ranks_share_gpu = is_true("SYMMPOOL_TEST_RANKS_SHARE_GPU");
  return env;
}

}  // namespace symmpool
