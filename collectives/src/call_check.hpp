#pragma once
// What a call's first meeting with its peers compares on the GPU: a 32-bit
// digest of the call's number, its operation and where the symmetric buffers
// it hands to peers lie in the heap. A cached symmetry verdict says a buffer
// was symmetric when it was checked; whether the peers' tensors of this call
// lie at the same offsets only the call itself can tell (ranks that allocate
// differently shift later tensors onto addresses checked for others). Each
// rank writes its digest into every peer's call row before it signals; after
// the wait each compares what its peers wrote with its own, so such calls
// fail every rank instead of pairing buffers that differ.

#include "error_words.hpp"

#include <cstddef>
#include <cstdint>

namespace symmpool::detail {

class CallCheck {
 public:
  // A new call: its number (the same on every rank) and operation.
  void begin(std::uint64_t number, const char* op) {
    number_ = static_cast<std::uint32_t>(number);
    state_ = mix(kSeed, number);
    for (const char* c = op; *c; ++c) state_ = mix(state_, static_cast<unsigned char>(*c));
    taken_ = false;
  }
  // The call's number, low 32 bits (beside the digest in the call words).
  std::uint32_t number() const { return number_; }
  // A symmetric buffer of this call, `offset` bytes into the heap.
  void add_buffer(std::size_t offset, std::size_t bytes) { state_ = mix(mix(state_, offset), bytes); }
  // The digest for the call's first meeting (never 0, which means "no
  // check", nor kFailedRankDigest), then 0 for the later ones: once this rank signalled a later
  // meeting, a peer may go on to its next call and overwrite its digest
  // before this rank reads it. A call of one meeting (a barrier) takes it
  // unused for the same reason.
  std::uint32_t take() {
    if (taken_) return 0;
    taken_ = true;
    const auto digest = static_cast<std::uint32_t>(state_ ^ (state_ >> 32));
    return digest != 0 && digest != kFailedRankDigest ? digest : 1;
  }

 private:
  static constexpr std::uint64_t kSeed = 0x9e3779b97f4a7c15ULL;
  static std::uint64_t mix(std::uint64_t h, std::uint64_t v) {  // splitmix64 of the two
    std::uint64_t x = h ^ (v + kSeed + (h << 6) + (h >> 2));
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }
  std::uint64_t state_ = 0;
  std::uint32_t number_ = 0;
  bool taken_ = true;
};

}  // namespace symmpool::detail
