#pragma once
// The host-mapped words through which kernels report a failure to the
// host (FailureMonitor) and learn that it is on record.

namespace symmpool::detail {

struct ErrorWords {
  // 0, or 1 + the rank a barrier waited for in vain; kFailedOnHost, or
  // kCallsDiffer (then `differing` names the rank). Nonzero: kernels drain.
  int missing;
  int acknowledged;  // set by the host once the failure is on record: stalled kernels may end
  // 0, or 1 + a rank whose call differs from ours (call_check.hpp), plus
  // kPeerHadFailed where that rank's digest says its communicator failed.
  int differing;
};
constexpr int kFailedOnHost = -1;
constexpr int kCallsDiffer = -2;
constexpr int kPeerHadFailed = 1 << 16;
// The digest a failed rank writes over its own in its peers' pads; no call has it.
constexpr unsigned kFailedRankDigest = 0xffffffffu;

}  // namespace symmpool::detail
