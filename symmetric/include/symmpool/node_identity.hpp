#pragma once
// Which node this process runs on, as NCCL tells nodes apart (its host
// hash): hostname and kernel boot id, or SYMMPOOL_HOST_ID when set. Ranks
// with different identities cannot share a symmetric heap.

#include <symmpool/env_reader.hpp>

#include <string>

namespace symmpool {

// Never empty and never contains whitespace (it travels in space-separated
// store values).
// `host_id`: SYMMPOOL_HOST_ID's value (as NCCL_HOSTID), when set.
std::string node_identity(const std::string& host_id = env::value("SYMMPOOL_HOST_ID"));

}  // namespace symmpool
