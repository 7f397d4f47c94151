#include <symmpool/error.hpp>
#include <symmpool/multicast.hpp>

namespace symmpool {

MulticastDecision decide_multicast(const DriverApi& drv, CUdevice device, bool requested,
                                   const Environment& env) {
  if (!requested) return {false, "multicast not requested"};
  if (env.nccl_nvls_disabled) return {false, "disabled by NCCL_NVLS_ENABLE=0"};
  if (env.torch_symm_multicast_disabled) return {false, "disabled by TORCH_SYMM_MEM_DISABLE_MULTICAST=1"};
  if (env.symmpool_multicast_disabled) return {false, "disabled by SYMMPOOL_DISABLE_MULTICAST=1"};
  int supported = 0;
  SYMMPOOL_CU_TRY(drv, cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, device));
  if (!supported) return {false, "device does not support multicast"};
  return {true, "multicast enabled"};
}

}  // namespace symmpool
