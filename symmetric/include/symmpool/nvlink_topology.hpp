#pragma once
// Whether the GPUs of a group are all joined by NVLink, as NVML sees them:
// NCCL's symmetric kernels read peers directly and are meant for NVLink.

#include <string>
#include <vector>

namespace symmpool {

// Empty when every pair of `pci_addresses` (one per rank, "domain:bus:device.0")
// is joined by NVLink; otherwise why not (two ranks on one GPU, a pair
// without NVLink, NVML missing or failing). One GPU needs no link.
std::string why_not_all_nvlink(const std::vector<std::string>& pci_addresses);

}  // namespace symmpool
