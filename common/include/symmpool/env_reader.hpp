#pragma once
// Reading environment variables. Each layer reads and documents its own
// settings with these (the allocator's environment.hpp, the collectives'
// collective_options.cpp, the torch bindings), so a value is parsed the
// same way, and refused with the same words, wherever it is read.

#include <string>

namespace symmpool::env {

std::string value(const char* name);  // "" when unset
bool is_true(const char* name);       // 1, true, yes or on, in any case
bool is_false(const char* name);      // 0, false, no or off, in any case
std::string lowered(const std::string& text);

// The whole number `text` (the value of variable `name`) in [lowest,
// highest], or `fallback` when `text` is empty. Throws logic_error naming
// the variable, the range and the text otherwise.
long long whole_number(const std::string& text, const char* name, long long fallback, long long lowest,
                       long long highest);

}  // namespace symmpool::env
