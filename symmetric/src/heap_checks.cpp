// SymmetricHeap's checks that every rank makes together: the same setting,
// the same call, and a buffer at the same offset and size everywhere.

#include "symmetric_heap_internal.hpp"

#include <symmpool/detail/format.hpp>
#include <symmpool/error.hpp>
#include <symmpool/log.hpp>
#include <symmpool/node_identity.hpp>
#include <symmpool/random_token.hpp>
#include <symmpool/symmetric_heap.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>

namespace symmpool {

void SymmetricHeap::require_same_setting(const std::string& name, const std::string& value) {
  SYMMPOOL_EXPECTS(name.find('\n') == std::string::npos && value.find('\n') == std::string::npos,
                   "symmetric heap '" + group_ + "': a setting's name and value must be one line");
  collective("require_same_setting", [&] {
    const auto all = exchange("setting " + name, value);
    for (int r = 0; r < world_; ++r)
      if (all[static_cast<std::size_t>(r)] != value)
        throw logic_error("symmetric heap '" + group_ + "': " + name + " is '" +
                          all[static_cast<std::size_t>(r)] + "' on rank " + std::to_string(r) + " but '" +
                          value + "' on rank " + std::to_string(rank_) + ": every rank must set it alike");
  });
}

void SymmetricHeap::check_same_call(const std::string& call) {
  SYMMPOOL_EXPECTS(call.find('\n') == std::string::npos,
                   "symmetric heap '" + group_ + "': a call's label must be one line");
  collective("check_same_call", [&] { exchange("call " + call, ""); });
}

void SymmetricHeap::check_symmetric(const void* local, std::size_t bytes, const std::string& what) {
  bool synced = false;
  check_symmetric_and_sync(local, bytes, what, /*sync_if_needed=*/false, &synced);
}

// Each rank sends "<offset> <bytes>" (or "outside <bytes>"), and, when
// asked and its segments changed since the last sync, "sync" and its
// listing on the lines after: so ranks that reach the same check agree on
// a sync whichever of them needs it, instead of one syncing alone.
void SymmetricHeap::check_symmetric_and_sync(const void* local, std::size_t bytes, const std::string& what,
                                             bool sync_if_needed, bool* synced, Extent extent) {
  // Exchanged values are "<what>\n<data>": a newline in the label would make
  // every rank look diverged and break the heap for good.
  SYMMPOOL_EXPECTS(what.find('\n') == std::string::npos,
                   "symmetric heap '" + group_ + "': the buffer label of check_symmetric has a newline");
  std::string mine = std::to_string(bytes);
  if (!allocator_.owns(local))
    mine = "outside " + mine;
  else if (extent == Extent::kOneLiveAllocation && !allocator_.live_allocation(local, bytes))
    mine = "unallocated " + mine;
  else
    mine = std::to_string(offset_of(local)) + " " + mine;
  std::uint64_t generation = 0;
  *synced = false;
  std::vector<std::string> verdicts(static_cast<std::size_t>(world_));
  collective("check_symmetric", [&] {
    if (sync_if_needed && needs_sync()) mine += "\nsync\n" + list_for_sync(&generation);
    auto all = exchange("check " + what, mine);  // ranks checking different buffers fail here
    std::vector<std::string> listings(all.size());
    std::vector<bool> listed(all.size(), false);
    for (std::size_t r = 0; r < all.size(); ++r) {
      const std::size_t newline = all[r].find('\n');
      verdicts[r] = all[r].substr(0, newline);
      if (newline != std::string::npos) {
        const std::string rest = all[r].substr(newline + 1);
        if (rest.rfind("sync\n", 0) != 0)
          throw divergence_error("symmetric heap '" + group_ + "': rank " + std::to_string(r) +
                                 " sent a malformed check");
        listings[r] = rest.substr(5);
        listed[r] = true;
      }
    }
    if (std::find(listed.begin(), listed.end(), true) != listed.end()) {
      apply_listings(listings, listed, generation);
      *synced = true;
    }
  });
  std::string report;
  for (int r = 0; r < world_; ++r)
    if (verdicts[static_cast<std::size_t>(r)] != verdicts[0])
      report += "; rank " + std::to_string(r) + " has (offset size) " +
                verdicts[static_cast<std::size_t>(r)] + " where rank 0 has " + verdicts[0];
  for (int r = 0; r < world_; ++r)
    if (verdicts[static_cast<std::size_t>(r)].rfind("outside", 0) == 0)
      report += "; rank " + std::to_string(r) + "'s buffer is not in the symmetric heap";
    else if (verdicts[static_cast<std::size_t>(r)].rfind("unallocated", 0) == 0)
      report += "; rank " + std::to_string(r) +
                "'s buffer is not inside one live allocation (freed, or spanning two)";
  if (!report.empty()) throw not_symmetric_error("buffer '" + what + "' is not symmetric" + report);
}

}  // namespace symmpool
