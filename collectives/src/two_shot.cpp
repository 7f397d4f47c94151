// all_reduce, and its two-shot algorithm: each rank reduces one chunk and
// writes it into every rank's output. It falls back to one-shot where
// two-shot cannot run (the buffers are not symmetric, or overlap).

#include "collective_helpers.hpp"
#include "kernels.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/cuda_try.hpp>

#include <algorithm>

namespace symmpool {

void Communicator::all_reduce(const void* in, void* out, std::size_t count, DataType type,
                              ReduceOp op, cudaStream_t stream, Algorithm algorithm) {
  check_errors();
  begin_call("all_reduce");
  if (count == 0) return;
  in_order(stream, "all_reduce", count * element_size(type),
           [&] { enqueue_all_reduce(in, out, count, type, op, stream, algorithm); });
}

void Communicator::enqueue_all_reduce(const void* in, void* out, std::size_t count, DataType type,
                                      ReduceOp op, cudaStream_t stream, Algorithm algorithm) {
  const std::size_t bytes = count * element_size(type);
  const bool explicit_choice = algorithm != Algorithm::kAuto;
  if (!explicit_choice) algorithm = choose_algorithm(CollectiveKind::kAllReduce, bytes, world());
  detail::expect_algorithm(algorithm == Algorithm::kOneShot || algorithm == Algorithm::kTwoShot, algorithm,
                           "all_reduce");
  if (algorithm == Algorithm::kTwoShot) {
    // Two-shot writes peers' outputs while they read our input: the buffers
    // must be the same one or apart, and the output symmetric.
    // Both checks run on every rank (they are collective): no short circuit.
    const bool in_symmetric = is_symmetric(in, bytes, "all_reduce input");
    const bool out_symmetric = is_symmetric(out, bytes, "all_reduce output");
    const bool usable = in_symmetric && out_symmetric && (in == out || !detail::overlap(in, bytes, out, bytes));
    SYMMPOOL_EXPECTS(usable || !explicit_choice,
                     "symmpool: two-shot all_reduce needs symmetric input and output that are the "
                     "same buffer or do not overlap");
    if (usable) return two_shot(in, out, count, type, scale(op), stream);
  }
  one_shot(in, count, out, count, 0, type, scale(op), stream);
}

void Communicator::two_shot(const void* in, void* out, std::size_t count, DataType type,
                            float scale, cudaStream_t stream) {
  const std::size_t es = element_size(type), n = static_cast<std::size_t>(world());
  require_symmetric(in, count * es, "all_reduce input");
  require_symmetric(out, count * es, "all_reduce output (two-shot)");
  // Rank r reduces chunk r and writes it into every rank's output. Chunks
  // are whole 16-byte vectors, so every load stays aligned.
  const std::size_t per_vector = 16 / es;
  const std::size_t chunk = ((count + n - 1) / n + per_vector - 1) / per_vector * per_vector;
  const std::size_t first = std::min(count, chunk * static_cast<std::size_t>(rank()));
  const std::size_t mine = std::min(chunk, count - first);
  detail::PeerPointers peers{};
  detail::OutPointers outs{};
  for (int p = 0; p < world(); ++p) {
    peers.ptr[p] = heap_.peer_ptr(in, p);
    outs.ptr[p] = heap_.peer_ptr(out, p);
  }
  const bool fused = fused_kernel(chunk * es);
  if (!fused) enqueue_barrier(stream, BarrierKind::kKernel);
  SYMMPOOL_CUDA_TRY(detail::launch_reduce(block_sync(fused), peers, first, outs, world(), first, mine,
                                          chunk, world(), type, scale, max_blocks_, stream));
  if (!fused) enqueue_barrier(stream, BarrierKind::kKernel);
}

}  // namespace symmpool
