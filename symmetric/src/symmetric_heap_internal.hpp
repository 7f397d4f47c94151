#pragma once
// What the files implementing SymmetricHeap share: a collective step that
// marks the heap failed when it throws, and the wire format's word split.
// symmetric_heap.cpp (exchange rounds, setup, the heap's own segments),
// heap_peer_mappings.cpp (the peers' segments mapped here),
// heap_segment_lists.cpp (segment lists sent and applied),
// heap_checks.cpp (checks every rank makes together).

#include <symmpool/error.hpp>
#include <symmpool/symmetric_heap.hpp>

#include <algorithm>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

namespace symmpool {

namespace detail {

// The space-separated words of one line of a heap's messages.
inline std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find(' ', start), text.size());
    if (end > start) words.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return words;
}

}  // namespace detail

template <typename F>
auto SymmetricHeap::collective(const char* what, F&& step) -> decltype(step()) {
  require_sound();
  try {
    return step();
  } catch (const not_symmetric_error&) {
    throw;  // a verdict every rank shares, not a failure
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_.empty())
      failure_ = "symmetric heap '" + group_ + "' rank " + std::to_string(rank_) + " of " +
                 std::to_string(world_) + " failed in " + what + ": " + e.what();
    throw;
  }
}

}  // namespace symmpool
