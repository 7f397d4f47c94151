#include <symmpool/env_reader.hpp>
#include <symmpool/error.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <exception>

namespace symmpool::env {

std::string value(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string lowered(const std::string& text) {
  std::string s = text;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool is_true(const char* name) {
  const std::string v = lowered(value(name));
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

bool is_false(const char* name) {
  const std::string v = lowered(value(name));
  return v == "0" || v == "false" || v == "no" || v == "off";
}

long long whole_number(const std::string& text, const char* name, long long fallback, long long lowest,
                       long long highest) {
  if (text.empty()) return fallback;
  std::size_t used = 0;
  long long number = 0;
  try {
    if (!std::isspace(static_cast<unsigned char>(text.front()))) number = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;  // not a number, or beyond long long
  }
  // The user's setting, not a place in the code: the message names the variable alone.
  if (used != text.size() || number < lowest || number > highest)
    throw logic_error(std::string(name) + " must be a whole number from " + std::to_string(lowest) + " to " +
                      std::to_string(highest) + ", got '" + text + "'");
  return number;
}

}  // namespace symmpool::env
