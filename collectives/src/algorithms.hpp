#pragma once
// The collectives' algorithms, free functions over the call's context
// (symmpool/detail/algorithm_context.hpp), each in its own file. The
// Communicator's entry points (communicator.cpp) number a call, put
// it in order and hand it here; all_reduce.cpp and reduce_scatter.cpp pick
// the algorithm of a reduction.

#include "reduction.hpp"

#include <symmpool/collective_types.hpp>
#include <symmpool/detail/algorithm_context.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>

namespace symmpool::detail {

// all_gather.cpp: copy engines pull from or push to every peer between two
// meetings, or one kernel reads every peer and meets them inside. With
// `stage_from`, `in` (symmetric) is first filled from it.
void all_gather(AlgorithmContext& ctx, const void* in, void* out, std::size_t bytes_per_rank,
                cudaStream_t stream, Algorithm algorithm, BarrierKind kind, const void* stage_from);

// reduce_scatter.cpp: one-shot or two-step.
void reduce_scatter(AlgorithmContext& ctx, const Reduction& r, Algorithm algorithm);
// all_reduce.cpp: low-latency, two-shot, two-step or one-shot.
void all_reduce(AlgorithmContext& ctx, const Reduction& r, Algorithm algorithm);
// What kAuto runs for an all_reduce of `bytes`: the preference, else the table.
Algorithm auto_all_reduce_algorithm(const Tuning& tuning, int world, std::size_t bytes);

// one_shot.cpp: every rank's input holds in_count elements; this rank
// reduces r.count of them from src_offset on.
void one_shot(AlgorithmContext& ctx, const Reduction& r, std::size_t in_count, std::size_t src_offset);
// two_shot.cpp
void two_shot(AlgorithmContext& ctx, const Reduction& r);
// two_step.cpp
void two_step_reduce_scatter(AlgorithmContext& ctx, const Reduction& r);
void two_step_all_reduce(AlgorithmContext& ctx, const Reduction& r);
// low_latency.cpp
void low_latency_all_reduce(AlgorithmContext& ctx, const Reduction& r);

}  // namespace symmpool::detail
