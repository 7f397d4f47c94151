#pragma once
// Size arithmetic on caller-given sizes: `(n + m - 1) / m * m` wraps to a
// small number for n near SIZE_MAX, so rounding checks for overflow instead.

#include <symmpool/detail/format.hpp>
#include <symmpool/error.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace symmpool::detail {

// `n` rounded up to a multiple of `multiple` (> 0). Throws logic_error naming
// `what` and the size when the result does not fit in std::size_t.
inline std::size_t round_up_checked(std::size_t n, std::size_t multiple, const char* what) {
  const std::size_t remainder = n % multiple;
  if (remainder == 0) return n;
  const std::size_t pad = multiple - remainder;
  if (n > SIZE_MAX - pad)
    throw logic_error("symmpool: " + std::string(what) + " of " + format_bytes(n) +
                      " cannot be rounded up to a multiple of " + format_bytes(multiple) +
                      ": it overflows size_t");
  return n + pad;
}

}  // namespace symmpool::detail
