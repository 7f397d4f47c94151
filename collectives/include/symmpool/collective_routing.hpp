#pragma once
// Where the "symm" backend runs a collective, as far as the call's shape,
// the settings and the algorithm table tell: plain values, no torch types.
// Every rank passes the same shapes and settings, so every rank reaches the
// same answer without asking its peers. The router
// (bindings/torch/c10d/collective_router.hpp) then adds what only the group's
// communicator can tell: whether the group spans nodes, whether the buffers
// lie in this rank's heap, whether they are symmetric on every rank.
//
// NCCL runs its symmetric kernels on every call whose buffers lie in its
// windows (NcclWindows) and reads each peer at this rank's offset in the
// window, on every rank's word alone. So window memory reaches NCCL only on
// Engine::kNcclWindows, after the communicator proved the call's buffers
// symmetric and its ranks at the same call (Communicator::meet_before_nccl);
// any other NCCL call gets plain copies of its window tensors (the torch
// backend's staging), so that no rank runs NCCL's symmetric kernels alone.

#include <symmpool/algorithm_table.hpp>
#include <symmpool/detail/peer_pointers.hpp>

#include <cstddef>
#include <cstdint>

namespace symmpool {

// Why a call runs where it does; to_string gives the text traces print.
enum class RouteReason : std::uint8_t {
  // symmpool runs it.
  kTablePrefersSymmpool,
  kCollectivesAlways,
  // NCCL runs it on buffers in its windows (Engine::kNcclWindows).
  kTablePrefersNcclWindows,
  kCollectivesNcclWindows,
  // NCCL runs it, decided from the call alone.
  kCollectivesDisabled,
  kSeveralTensors,
  kNotCuda,
  kTooManyRanks,
  kDtypeNotSupported,
  kDtypesDiffer,
  kReduceOpNotSupported,
  kNotContiguous,
  kSizesDoNotMatch,
  kEmpty,
  kTablePrefersNccl,
  // NCCL runs it, decided by the communicator (counted as NCCL fallbacks).
  kGroupSpansNodes,
  kNotInHeap,
  kNotSymmetric,
  kNoNcclWindows,
};
inline constexpr int kRouteReasons = static_cast<int>(RouteReason::kNoNcclWindows) + 1;

constexpr const char* to_string(RouteReason r) {
  switch (r) {
    case RouteReason::kTablePrefersSymmpool:
      return "table prefers symmpool at this size";
    case RouteReason::kCollectivesAlways:
      return "SYMMPOOL_COLLECTIVES=always";
    case RouteReason::kTablePrefersNcclWindows:
      return "table prefers NCCL's symmetric kernels at this size";
    case RouteReason::kCollectivesNcclWindows:
      return "SYMMPOOL_COLLECTIVES=nccl-windows";
    case RouteReason::kCollectivesDisabled:
      return "collectives disabled";
    case RouteReason::kSeveralTensors:
      return "several tensors in one call";
    case RouteReason::kNotCuda:
      return "not a CUDA tensor";
    case RouteReason::kTooManyRanks:
      return "more ranks than symmpool supports";
    case RouteReason::kDtypeNotSupported:
      return "dtype not supported";
    case RouteReason::kDtypesDiffer:
      return "input and output dtypes differ";
    case RouteReason::kReduceOpNotSupported:
      return "reduce op not supported";
    case RouteReason::kNotContiguous:
      return "not contiguous";
    case RouteReason::kSizesDoNotMatch:
      return "sizes do not match the group";
    case RouteReason::kEmpty:
      return "empty tensor";
    case RouteReason::kTablePrefersNccl:
      return "table prefers NCCL at this size";
    case RouteReason::kGroupSpansNodes:
      return "group spans nodes";
    case RouteReason::kNotInHeap:
      return "buffer not in symmpool heap";
    case RouteReason::kNotSymmetric:
      return "buffer not symmetric on every rank";
    case RouteReason::kNoNcclWindows:
      return "no NCCL windows on this group";
  }
  return "unknown";
}

// The calls memory_stats() counts as "symm_collectives".
constexpr bool runs_on_symmpool(RouteReason r) {
  return r == RouteReason::kTablePrefersSymmpool || r == RouteReason::kCollectivesAlways;
}

// The calls memory_stats() counts as "nccl_fallbacks": symmpool was asked
// and turned them down.
constexpr bool is_nccl_fallback(RouteReason r) {
  return r == RouteReason::kGroupSpansNodes || r == RouteReason::kNotInHeap ||
         r == RouteReason::kNotSymmetric || r == RouteReason::kNoNcclWindows;
}

constexpr const char* to_string(Engine e) {
  return e == Engine::kSymmpool ? "symmpool" : e == Engine::kNcclWindows ? "NCCL on windows" : "NCCL";
}

constexpr const char* to_string(CollectiveKind k) {
  return k == CollectiveKind::kAllGather       ? "all_gather"
         : k == CollectiveKind::kReduceScatter ? "reduce_scatter"
                                               : "all_reduce";
}

struct RouteDecision {
  Engine engine;
  RouteReason reason;
};

// SYMMPOOL_COLLECTIVES: unset (the table decides), "0", "always" or
// "nccl-windows".
struct RoutingSettings {
  bool enabled = true;
  bool always = false;        // symmpool, whatever the table says
  bool nccl_windows = false;  // NCCL on its windows, whatever the table says

  // SYMMPOOL_COLLECTIVES: unset, the algorithm table decides (world sizes it
  // has no measurements for stay on NCCL); "always", symmpool takes every
  // call it can (tests); "nccl-windows", NCCL over its symmetric windows
  // takes them (tests, benchmarks); "0", NCCL runs every collective.
  static RoutingSettings from_process();
};

// SYMMPOOL_NCCL_WINDOWS=0: a "symm" group makes no NCCL windows of its
// symmetric segments (they stay registered locally).
bool nccl_windows_from_process();

// As the variable would be set: "0", "always", "nccl-windows", or "table" where unset.
constexpr const char* to_string(RoutingSettings s) {
  return !s.enabled ? "0" : s.always ? "always" : s.nccl_windows ? "nccl-windows" : "table";
}

// One collective as plain values. all_gather: output holds world inputs;
// reduce_scatter: input holds world outputs; all_reduce: as many of each.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::kAllGather;
  int world = 1;
  bool on_cuda = true;
  bool contiguous = true;  // input and output
  bool same_dtype = true;
  bool dtype_supported = true;      // one symmpool reduces (all-gather copies any)
  bool reduce_op_supported = true;  // sum or avg (all-gather has none)
  std::int64_t input_numel = 0, output_numel = 0;
  std::size_t element_size = 0;
  bool captured = false;  // into a CUDA graph (asked only where the table has windows at this world size)
};

// What the table looks at: all-gather output, reduce-scatter input,
// all-reduce buffer.
constexpr std::size_t table_bytes(const CollectiveCall& c) {
  const std::int64_t numel = c.kind == CollectiveKind::kAllGather ? c.output_numel : c.input_numel;
  return static_cast<std::size_t>(numel) * c.element_size;
}

constexpr RouteDecision route_by_shape(const CollectiveCall& c, RoutingSettings settings) {
  const bool reduces = c.kind != CollectiveKind::kAllGather;
  const bool sizes_match = c.kind == CollectiveKind::kAllGather ? c.output_numel == c.input_numel * c.world
                           : c.kind == CollectiveKind::kReduceScatter
                               ? c.input_numel == c.output_numel * c.world
                               : c.input_numel == c.output_numel;
  auto nccl = [](RouteReason r) { return RouteDecision{Engine::kNccl, r}; };
  if (!settings.enabled) return nccl(RouteReason::kCollectivesDisabled);
  if (!c.on_cuda) return nccl(RouteReason::kNotCuda);
  if (c.world > detail::kMaxRanks) return nccl(RouteReason::kTooManyRanks);
  if (reduces && !c.dtype_supported) return nccl(RouteReason::kDtypeNotSupported);
  if (!c.same_dtype) return nccl(RouteReason::kDtypesDiffer);
  if (reduces && !c.reduce_op_supported) return nccl(RouteReason::kReduceOpNotSupported);
  if (!c.contiguous) return nccl(RouteReason::kNotContiguous);
  if (!sizes_match) return nccl(RouteReason::kSizesDoNotMatch);
  if ((reduces ? c.output_numel : c.input_numel) == 0) return nccl(RouteReason::kEmpty);
  if (settings.always) return {Engine::kSymmpool, RouteReason::kCollectivesAlways};
  if (settings.nccl_windows) return {Engine::kNcclWindows, RouteReason::kCollectivesNcclWindows};
  switch (choose_engine(c.kind, table_bytes(c), c.world, c.captured)) {
    case Engine::kNccl:
      return nccl(RouteReason::kTablePrefersNccl);
    case Engine::kNcclWindows:
      return {Engine::kNcclWindows, RouteReason::kTablePrefersNcclWindows};
    case Engine::kSymmpool:
      break;
  }
  return {Engine::kSymmpool, RouteReason::kTablePrefersSymmpool};
}

}  // namespace symmpool
