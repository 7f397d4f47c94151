// The routing settings as the environment gives them (collective_routing.hpp).

#include <symmpool/collective_routing.hpp>
#include <symmpool/env_reader.hpp>

namespace symmpool {

RoutingSettings RoutingSettings::from_process() {
  const std::string mode = env::lowered(env::value("SYMMPOOL_COLLECTIVES"));
  RoutingSettings s;
  s.enabled = !env::is_false("SYMMPOOL_COLLECTIVES");
  s.always = mode == "always";
  s.nccl_windows = mode == "nccl-windows";
  return s;
}

bool nccl_windows_from_process() { return !env::is_false("SYMMPOOL_NCCL_WINDOWS"); }

}  // namespace symmpool
