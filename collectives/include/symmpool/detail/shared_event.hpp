#pragma once
// The end of one piece of work on its stream: a CUDA event recorded once and
// shared by whoever orders work after it or asks whether it finished (the
// next collective on another stream, the flight record, a c10d Work). Made
// by an EventPool (collectives/src/event_pool.hpp), it goes back there when
// its last holder lets go, never sooner: no holder sees it recorded again.

#include <cuda_runtime_api.h>

#include <memory>
#include <type_traits>

namespace symmpool::detail {

using SharedEvent = std::shared_ptr<std::remove_pointer_t<cudaEvent_t>>;

}  // namespace symmpool::detail
