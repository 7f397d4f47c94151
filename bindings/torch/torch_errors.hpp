#pragma once
// symmpool exceptions become the torch errors Python users expect:
// out_of_memory -> torch.OutOfMemoryError, anything else -> RuntimeError.

#include <symmpool/error.hpp>

#include <c10/util/Exception.h>

namespace symmpool::torch_ext {

template <typename F>
auto call_translating_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const symmpool::out_of_memory& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace symmpool::torch_ext
