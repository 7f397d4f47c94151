// Which algorithm runs an all_reduce: the low-latency one (low_latency.cpp)
// takes small messages in any memory; two-shot (two_shot.cpp) or two-step
// (two_step.cpp) where the table or the caller says and the buffers allow;
// one-shot (one_shot.cpp) where they cannot run (the buffers are not
// symmetric, or overlap).

#include "algorithms.hpp"
#include "collective_helpers.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/error.hpp>

#include <string>

namespace symmpool::detail {

static_assert(kLowLatencyTableBytes <= Communicator::kLowLatencyMaxBytes,
              "the table picks low-latency where it cannot run");

Algorithm auto_all_reduce_algorithm(const Tuning& tuning, int world, std::size_t bytes) {
  return tuning.all_reduce_preference.value_or(choose_algorithm(CollectiveKind::kAllReduce, bytes, world));
}

void all_reduce(AlgorithmContext& ctx, const Reduction& r, Algorithm algorithm) {
  const std::size_t bytes = r.bytes();
  const int world = ctx.world();
  const std::size_t low_latency_max_bytes = ctx.tuning().low_latency_max_bytes;
  const bool explicit_choice = algorithm != Algorithm::kAuto;
  const Algorithm by_table = choose_algorithm(CollectiveKind::kAllReduce, bytes, world);
  if (!explicit_choice) algorithm = auto_all_reduce_algorithm(ctx.tuning(), world, bytes);
  expect_algorithm(runs_all_reduce(algorithm), algorithm, "all_reduce");
  if (algorithm == Algorithm::kLowLatency) {
    // By size alone, the same on every rank (low_latency.cpp deals with overlaps).
    const bool usable = bytes <= low_latency_max_bytes;
    SYMMPOOL_EXPECTS(usable || !explicit_choice,
                     "symmpool: low-latency all_reduce takes up to " + std::to_string(low_latency_max_bytes) +
                         " bytes at " + std::to_string(world) + " ranks, got " + std::to_string(bytes));
    if (usable) return low_latency_all_reduce(ctx, r);
    // A preference from the environment, or the table, where it cannot run.
    algorithm = by_table == Algorithm::kLowLatency ? Algorithm::kTwoShot : by_table;
  }
  if (algorithm == Algorithm::kTwoShot || algorithm == Algorithm::kTwoStep) {
    // Both write peers' outputs while they read our input: the buffers must
    // be the same one or apart, and the output symmetric.
    // Both checks run on every rank (they are collective): no short circuit.
    const bool in_symmetric = ctx.is_symmetric(r.in, bytes, "all_reduce input");
    const bool out_symmetric = ctx.is_symmetric(r.out, bytes, "all_reduce output");
    const bool usable =
        in_symmetric && out_symmetric && (r.in == r.out || !overlap(r.in, bytes, r.out, bytes));
    SYMMPOOL_EXPECTS(usable || !explicit_choice,
                     std::string("symmpool: ") + to_string(algorithm) +
                         " all_reduce needs symmetric input and output that are the same buffer or do not "
                         "overlap");
    if (usable) return algorithm == Algorithm::kTwoShot ? two_shot(ctx, r) : two_step_all_reduce(ctx, r);
  }
  one_shot(ctx, r, r.count, 0);
}

}  // namespace symmpool::detail
