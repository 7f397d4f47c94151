#pragma once
// Human-readable sizes and pointers for error messages.

#include <cstddef>
#include <cstdio>
#include <string>

namespace symmpool::detail {

inline std::string format_bytes(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return std::string(buf) + (unit == 0 ? "" : " (" + std::to_string(bytes) + " bytes)");
}

inline std::string format_pointer(const void* ptr) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", ptr);
  return buf;
}

}  // namespace symmpool::detail
