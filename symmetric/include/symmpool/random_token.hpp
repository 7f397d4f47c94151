#pragma once
// Unguessable tokens (socket names, secrets) from the kernel's CSPRNG.

#include <cstddef>
#include <string>

namespace symmpool {

// `bytes` random bytes from getrandom(2) (/dev/urandom where it is missing),
// as 2 * bytes lowercase hex characters. Throws std::system_error when no
// randomness can be had: never falls back to a guessable value.
std::string random_token(std::size_t bytes);

// True when `text` is 1 to `max_chars` lowercase hex characters.
bool is_hex_token(const std::string& text, std::size_t max_chars);

}  // namespace symmpool
