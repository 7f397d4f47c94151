#pragma once
// Where each collective of a "symm" group runs. The router decides once per
// call, in route(): first from the call alone (symmpool/collective_routing.hpp:
// settings, dtype, op, layout, sizes, then the algorithm table), the same
// way on every rank; then, for a call symmpool may take, from the group's
// communicator, which enqueues it. Every decision is counted by its reason;
// with the ROUTING subsystem at INFO (SYMMPOOL_DEBUG=INFO, or
// SYMMPOOL_DEBUG_ROUTING=1; read when the group is made) each one is also
// logged (log.hpp).

#include <symmpool/collective_routing.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/driver_api.hpp>
#include <symmpool/nccl_windows.hpp>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace symmpool::torch_ext {

// The element type symmpool's reductions take for `t`, if any.
std::optional<DataType> symmpool_type(at::ScalarType t);

class CollectiveRouter {
 public:
  // The group's communicator on `device`, made on the first call that may
  // run on symmpool (every rank reaches it together); null, on every rank,
  // when the group spans nodes.
  using CommunicatorOf = std::function<Communicator*(c10::DeviceIndex device)>;
  // The group's NCCL windows, null until they are made (at the same call
  // on every rank).
  using WindowsOf = std::function<const NcclWindows*()>;

  // `group`: the backend routed for (its rank, size and name), outlives us.
  CollectiveRouter(const c10d::Backend& group, RoutingSettings settings, bool nccl_windows_enabled,
                   CommunicatorOf communicator, WindowsOf windows);

  // Where one collective runs. Outputs on another device than the inputs
  // raise. A call symmpool may take goes to NCCL when the group spans nodes,
  // or when a buffer is outside this rank's heap (plain tensors: decided
  // without asking the peers, counted as a call run elsewhere) and the
  // algorithm needs symmetric memory (all but a low-latency all-reduce); otherwise it
  // is enqueued on the current stream, and goes to NCCL when its buffers are
  // not symmetric on every rank (one check that every rank sees). A call
  // for NCCL's windows (the table's, or SYMMPOOL_COLLECTIVES=nccl-windows),
  // and one the table gives NCCL, runs on Engine::kNcclWindows where the
  // group has windows and both buffers lie in the heap, once the
  // communicator met the peers over them (Communicator::meet_before_nccl);
  // the caller must stage the window tensors of a call that comes back
  // Engine::kNccl (window_staging.hpp). Any other failure raises: it is
  // never hidden behind NCCL. `op`: reductions only.
  RouteDecision route(CollectiveKind kind, const at::Tensor& output, const at::Tensor& input,
                      c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM);
  // A call of several tensors: NCCL's, counted and traced like the others
  // (`tensors`: those whose bytes the table would look at).
  void route_several(CollectiveKind kind, const std::vector<at::Tensor>& tensors);
  // SYMMPOOL_COLLECTIVES as this router read it: every rank must share it.
  RoutingSettings settings() const { return settings_; }

 private:
  // The call enqueued on symmpool (`eligible` comes back), or why not.
  RouteDecision run_on_symmpool(CollectiveKind kind, const at::Tensor& output, const at::Tensor& input,
                                std::optional<DataType> type, c10d::ReduceOp::RedOpType op,
                                RouteDecision eligible);
  // `asked` on NCCL's windows after the meeting, or why not.
  RouteDecision run_on_nccl_windows(CollectiveKind kind, const at::Tensor& output, const at::Tensor& input,
                                    RouteDecision asked);
  // The communicator of `device`, made current here (a guard where needed).
  Communicator* communicator_on(const at::Device& device, std::optional<c10::cuda::CUDAGuard>& guard);
  void record(CollectiveKind kind, std::size_t bytes, RouteDecision decision) const;
  // Whether the context current on this thread is the one the last call
  // ran in, under a guard of its device: then that device is current for
  // the driver and the runtime (every c10 call here names it anyway).
  bool in_device_context() const;

  const c10d::Backend& group_;
  RoutingSettings settings_;
  bool nccl_windows_enabled_;  // SYMMPOOL_NCCL_WINDOWS
  bool trace_ = false;
  CommunicatorOf communicator_;
  WindowsOf windows_;
  // The context a device guard last made current here: a group runs on one
  // device (SymmBackend refuses a second), so it is that device's. Calls
  // come from any thread.
  std::atomic<CUcontext> device_context_{nullptr};
};

// Calls the symm backends of this process routed, by reason.
std::array<std::uint64_t, kRouteReasons> routing_counts();

// Collectives the symm backends of this process ran themselves, those NCCL
// ran on its windows, and calls symmpool turned down (group spanning nodes,
// buffers outside the heap or not symmetric, no windows) that NCCL ran.
struct CollectiveCounts {
  std::uint64_t routed = 0;
  std::uint64_t on_nccl_windows = 0;
  std::uint64_t fallbacks = 0;
};
CollectiveCounts collective_counts();

}  // namespace symmpool::torch_ext
