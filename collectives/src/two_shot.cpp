// all_reduce, and its two-shot algorithm: each rank reduces one chunk and
// writes it into every rank's output. It falls back to one-shot where
// two-shot or two-step (two_step.cpp) cannot run (the buffers are not
// symmetric, or overlap); the low-latency one (low_latency.cpp) takes small
// messages, in any memory.

#include "collective_helpers.hpp"
#include "kernels.hpp"
#include "reduction.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/error.hpp>

#include <algorithm>
#include <string>

namespace symmpool {

void Communicator::all_reduce(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                              cudaStream_t stream, Algorithm algorithm) {
  check_errors();
  begin_call("all_reduce");
  if (count == 0) return;
  const Reduction r{in, out, count, type, scale(op), stream};
  in_order(stream, "all_reduce", r.bytes(), [&] { enqueue_all_reduce(r, algorithm); });
}

static_assert(kLowLatencyTableBytes <= Communicator::kLowLatencyMaxBytes,
              "the table picks low-latency where it cannot run");

Algorithm Communicator::auto_all_reduce_algorithm(std::size_t bytes) const {
  return tuning_.all_reduce_preference.value_or(choose_algorithm(CollectiveKind::kAllReduce, bytes, world()));
}

bool Communicator::all_reduce_takes_any_memory(std::size_t bytes) const {
  return auto_all_reduce_algorithm(bytes) == Algorithm::kLowLatency && bytes <= low_latency_max_bytes();
}

void Communicator::enqueue_all_reduce(const Reduction& r, Algorithm algorithm) {
  const std::size_t bytes = r.bytes();
  const bool explicit_choice = algorithm != Algorithm::kAuto;
  const Algorithm by_table = choose_algorithm(CollectiveKind::kAllReduce, bytes, world());
  if (!explicit_choice) algorithm = auto_all_reduce_algorithm(bytes);
  detail::expect_algorithm(runs_all_reduce(algorithm), algorithm, "all_reduce");
  if (algorithm == Algorithm::kLowLatency) {
    // By size alone, the same on every rank (low_latency.cpp deals with overlaps).
    const bool usable = bytes <= low_latency_max_bytes();
    SYMMPOOL_EXPECTS(usable || !explicit_choice, "symmpool: low-latency all_reduce takes up to " +
                                                     std::to_string(low_latency_max_bytes()) + " bytes at " +
                                                     std::to_string(world()) + " ranks, got " +
                                                     std::to_string(bytes));
    if (usable) return low_latency_all_reduce(r);
    // A preference from the environment, or the table, where it cannot run.
    algorithm = by_table == Algorithm::kLowLatency ? Algorithm::kTwoShot : by_table;
  }
  if (algorithm == Algorithm::kTwoShot || algorithm == Algorithm::kTwoStep) {
    // Both write peers' outputs while they read our input: the buffers must
    // be the same one or apart, and the output symmetric.
    // Both checks run on every rank (they are collective): no short circuit.
    const bool in_symmetric = is_symmetric(r.in, bytes, "all_reduce input");
    const bool out_symmetric = is_symmetric(r.out, bytes, "all_reduce output");
    const bool usable =
        in_symmetric && out_symmetric && (r.in == r.out || !detail::overlap(r.in, bytes, r.out, bytes));
    SYMMPOOL_EXPECTS(usable || !explicit_choice,
                     std::string("symmpool: ") + to_string(algorithm) +
                         " all_reduce needs symmetric input and output that are the same buffer or do not "
                         "overlap");
    if (usable) return algorithm == Algorithm::kTwoShot ? two_shot(r) : two_step_all_reduce(r);
  }
  one_shot(r, r.count, 0);
}

void Communicator::two_shot(const Reduction& r) {
  const std::size_t es = element_size(r.type);
  require_symmetric(r.in, r.bytes(), "all_reduce input");
  require_symmetric(r.out, r.bytes(), "all_reduce output (two-shot)");
  // Rank i reduces chunk i and writes it into every rank's output.
  const ChunkOfRank mine = chunk_of_rank(r.count, es);
  const bool fused = fused_reduction(mine.stride * es);
  detail::ReduceLaunch launch = reduce_launch(r, fused, kTwoShotFusedBlocks);
  for (int p = 0; p < world(); ++p) {
    launch.in.ptr[p] = heap_.peer_ptr(r.in, p);
    launch.out.ptr[p] = heap_.peer_ptr(r.out, p);
  }
  launch.n_outs = world();
  launch.src_offset = mine.first;
  launch.dst_offset = mine.first;
  launch.count = mine.count;
  launch.grid_count = mine.stride;  // equal on every rank, even where the last chunk is short
  if (!fused) enqueue_barrier(r.stream, BarrierKind::kKernel);
  SYMMPOOL_CUDA_TRY(detail::launch_reduce(launch, r.stream));
  if (!fused) enqueue_barrier(r.stream, BarrierKind::kKernel);
  detail::count_algorithm(Algorithm::kTwoShot);
}

}  // namespace symmpool
