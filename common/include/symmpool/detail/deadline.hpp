#pragma once
// A deadline `timeout` from now. `now() + timeout` overflows the clock's
// nanoseconds for huge timeouts: milliseconds::max() wraps into the past and
// times out at once. So the sum saturates at the clock's end of time.

#include <chrono>

namespace symmpool::detail {

template <typename Clock = std::chrono::steady_clock>
typename Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  const typename Clock::time_point now = Clock::now();
  if (timeout <= std::chrono::milliseconds::zero()) return now;
  // Compared in milliseconds: `timeout` in the clock's unit may not fit.
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now);
  if (timeout >= room) return Clock::time_point::max();
  return now + std::chrono::duration_cast<typename Clock::duration>(timeout);
}

}  // namespace symmpool::detail
