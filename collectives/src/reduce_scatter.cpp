// Which algorithm runs a reduce_scatter: two-step (two_step.cpp) where the
// table, the setting or the caller says, one-shot (one_shot.cpp) otherwise.

#include "algorithms.hpp"
#include "collective_helpers.hpp"

#include <symmpool/algorithm_table.hpp>

namespace symmpool::detail {

void reduce_scatter(AlgorithmContext& ctx, const Reduction& r, Algorithm algorithm) {
  const std::size_t n = static_cast<std::size_t>(ctx.world());
  if (algorithm == Algorithm::kAuto)
    algorithm = ctx.tuning().reduce_scatter_preference.value_or(
        choose_algorithm(CollectiveKind::kReduceScatter, r.bytes() * n, ctx.world()));
  expect_algorithm(runs_reduce_scatter(algorithm), algorithm, "reduce_scatter");
  if (algorithm == Algorithm::kTwoStep)
    two_step_reduce_scatter(ctx, r);
  else
    one_shot(ctx, r, r.count * n,
             r.count * static_cast<std::size_t>(ctx.rank()));  // our chunk of every input
}

}  // namespace symmpool::detail
