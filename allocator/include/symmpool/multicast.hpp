#pragma once
// Whether segments are made multicast-capable. Off unless asked for, the
// device supports it, and no environment variable turns it off. On the shared
// H200 test hosts it must stay off: DESIGN.md says why.

#include <symmpool/driver_api.hpp>
#include <symmpool/environment.hpp>

#include <string>

namespace symmpool {

struct MulticastDecision {
  bool enabled = false;
  std::string reason;  // why it is on or off, for logs and errors
};

// Makes no cuMulticast* call; reads the device attribute only when multicast
// was requested and the environment allows it.
MulticastDecision decide_multicast(const DriverApi& drv, CUdevice device, bool requested,
                                   const Environment& env);

}  // namespace symmpool
