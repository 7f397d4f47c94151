#pragma once
// Which node this process runs on, as NCCL tells nodes apart (its host
// hash): hostname and kernel boot id, or SYMMPOOL_HOST_ID when set. Ranks
// with different identities cannot share a symmetric heap.

#include <symmpool/environment.hpp>

#include <string>

namespace symmpool {

// Never empty and never contains whitespace (it travels in space-separated
// store values).
std::string node_identity(const Environment& env = Environment::from_process());

}  // namespace symmpool
