#pragma once
// The host-mapped words through which kernels report a failure to the
// host (FailureMonitor) and learn that it is on record.

namespace symmpool::detail {

struct ErrorWords {
  // 0, or 1 + the rank a barrier waited for in vain; kFailedOnHost, or
  // kCallsDiffer (then `differing` names the rank). Nonzero: kernels drain.
  int missing;
  int acknowledged;  // set by the host once the failure is on record: stalled kernels may end
  int differing;     // 0, or 1 + a rank whose call differs from ours (call_check.hpp)
};
constexpr int kFailedOnHost = -1;
constexpr int kCallsDiffer = -2;

}  // namespace symmpool::detail
