#include <symmpool/nvlink_topology.hpp>

#include <dlfcn.h>

#include <cstddef>

namespace symmpool {

namespace {

// NVML's C ABI, declared here: the library is found at run time, as the
// driver, and no NVML header is needed to build.
using nvmlReturn = int;
using nvmlDevice = struct nvmlDevice_st*;
constexpr nvmlReturn kNvmlSuccess = 0;
constexpr int kP2PCapsIndexNvlink = 2;  // NVML_P2P_CAPS_INDEX_NVLINK
constexpr int kP2PStatusOk = 0;         // NVML_P2P_STATUS_OK

struct Nvml {
  nvmlReturn (*init)() = nullptr;
  nvmlReturn (*shutdown)() = nullptr;
  nvmlReturn (*handle_by_pci)(const char*, nvmlDevice*) = nullptr;
  nvmlReturn (*p2p_status)(nvmlDevice, nvmlDevice, int, int*) = nullptr;
};

template <typename Fn>
bool resolve(void* library, Fn& fn, const char* name) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  return fn != nullptr;
}

}  // namespace

std::string why_not_all_nvlink(const std::vector<std::string>& pci_addresses) {
  for (std::size_t a = 0; a < pci_addresses.size(); ++a)
    for (std::size_t b = a + 1; b < pci_addresses.size(); ++b)
      if (pci_addresses[a] == pci_addresses[b])
        return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " share the GPU at " +
               pci_addresses[a];
  if (pci_addresses.size() < 2) return "";
  // Kept loaded: NVML is cheap to keep and unloading it races other users.
  static void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return "NVML (libnvidia-ml.so.1) cannot be loaded to see the links";
  Nvml nvml;
  if (!resolve(library, nvml.init, "nvmlInit_v2") || !resolve(library, nvml.shutdown, "nvmlShutdown") ||
      !resolve(library, nvml.handle_by_pci, "nvmlDeviceGetHandleByPciBusId_v2") ||
      !resolve(library, nvml.p2p_status, "nvmlDeviceGetP2PStatus"))
    return "NVML lacks the functions that tell the links";
  if (nvml.init() != kNvmlSuccess) return "NVML did not initialise";
  std::string why;
  std::vector<nvmlDevice> devices(pci_addresses.size(), nullptr);
  for (std::size_t r = 0; r < devices.size() && why.empty(); ++r)
    if (nvml.handle_by_pci(pci_addresses[r].c_str(), &devices[r]) != kNvmlSuccess)
      why = "NVML does not know the GPU at " + pci_addresses[r];
  for (std::size_t a = 0; a < devices.size() && why.empty(); ++a)
    for (std::size_t b = a + 1; b < devices.size() && why.empty(); ++b) {
      int status = -1;
      if (nvml.p2p_status(devices[a], devices[b], kP2PCapsIndexNvlink, &status) != kNvmlSuccess ||
          status != kP2PStatusOk)
        why = "the GPUs of ranks " + std::to_string(a) + " and " + std::to_string(b) + " (" +
              pci_addresses[a] + ", " + pci_addresses[b] + ") are not joined by NVLink";
    }
  nvml.shutdown();
  return why;
}

}  // namespace symmpool
