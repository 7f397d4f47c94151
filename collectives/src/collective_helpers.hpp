#pragma once
// Small helpers the collectives' files share: byte arithmetic on buffers and
// the check of an algorithm the caller named.

#include <symmpool/algorithm_table.hpp>
#include <symmpool/error.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace symmpool::detail {

inline bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

inline const char* at(const void* p, std::size_t offset) { return static_cast<const char*>(p) + offset; }
inline char* at(void* p, std::size_t offset) { return static_cast<char*>(p) + offset; }

// Adds one to what algorithm_counts() reports for `a` (communicator.cpp).
void count_algorithm(Algorithm a);

inline void expect_algorithm(bool ok, Algorithm a, const char* op) {
  SYMMPOOL_EXPECTS(ok, std::string("symmpool: algorithm '") + to_string(a) + "' does not apply to " + op);
}

}  // namespace symmpool::detail
