#pragma once
// Streams and events that destroy themselves: the side streams a collective
// forks onto live as long as their owner, with no make/destroy pairs to
// keep in step. Destruction ignores errors (at exit CUDA may be gone).

#include <cuda_runtime_api.h>

#include <memory>
#include <type_traits>

namespace symmpool::detail {

struct StreamDestroyer {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};
struct EventDestroyer {
  void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
};
using UniqueStream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDestroyer>;
using UniqueEvent = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDestroyer>;

// A non-blocking stream on the current device (it never waits for the legacy default stream).
UniqueStream new_stream();
// An event without timing: what forks and joins need, and the cheapest to record.
UniqueEvent new_event();

}  // namespace symmpool::detail
