#include "c10d/collective_router.hpp"

#include "torch_errors.hpp"

#include <symmpool/log.hpp>

#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <cstdio>
#include <optional>

namespace symmpool::torch_ext {

namespace {

// Every symm backend of the process counts here: memory_stats() reads them.
std::array<std::atomic<std::uint64_t>, kRouteReasons> decisions{};
std::atomic<std::uint64_t> on_windows{0};  // decisions whose engine is NCCL on windows

constexpr RouteDecision nccl(RouteReason reason) { return {Engine::kNccl, reason}; }

}  // namespace

std::optional<DataType> symmpool_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DataType::kFloat32;
    case at::kHalf:
      return DataType::kFloat16;
    case at::kBFloat16:
      return DataType::kBFloat16;
    default:
      return std::nullopt;
  }
}

CollectiveRouter::CollectiveRouter(const c10d::Backend& group, RoutingSettings settings,
                                   bool nccl_windows_enabled, CommunicatorOf communicator, WindowsOf windows)
    : group_(group),
      settings_(settings),
      nccl_windows_enabled_(nccl_windows_enabled),
      trace_(log::enabled(log::Level::kInfo, log::kRouting)),
      communicator_(std::move(communicator)),
      windows_(std::move(windows)) {}

RouteDecision CollectiveRouter::route(CollectiveKind kind, const at::Tensor& output, const at::Tensor& input,
                                      c10d::ReduceOp::RedOpType op) {
  TORCH_CHECK(output.device() == input.device(), "symm ", to_string(kind), ": output on ", output.device(),
              ", input on ", input.device());
  const std::optional<DataType> type = symmpool_type(input.scalar_type());
  CollectiveCall call;
  call.kind = kind;
  call.world = group_.getSize();
  call.on_cuda = input.is_cuda();
  call.contiguous = input.is_contiguous() && output.is_contiguous();
  call.same_dtype = input.scalar_type() == output.scalar_type();
  call.dtype_supported = type.has_value();
  call.reduce_op_supported = op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG;
  call.input_numel = input.numel();
  call.output_numel = output.numel();
  call.element_size = input.element_size();
  // Only where the table has NCCL windows at this world size: the query
  // costs a driver call.
  if (has_nccl_window_ranges(call.world) && call.on_cuda)
    call.captured = c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  RouteDecision decision = route_by_shape(call, settings_);
  if (decision.engine == Engine::kSymmpool)
    decision = run_on_symmpool(kind, output, input, type, op, decision);
  else if (decision.engine == Engine::kNcclWindows || decision.reason == RouteReason::kTablePrefersNccl)
    decision = run_on_nccl_windows(kind, output, input, decision);
  record(kind, table_bytes(call), decision);
  return decision;
}

RouteDecision CollectiveRouter::run_on_symmpool(CollectiveKind kind, const at::Tensor& output,
                                                const at::Tensor& input, std::optional<DataType> type,
                                                c10d::ReduceOp::RedOpType op, RouteDecision eligible) {
  const at::Device device = input.device();
  std::optional<c10::cuda::CUDAGuard> guard;
  Communicator* comm = communicator_on(device, guard);
  if (!comm) return nccl(RouteReason::kGroupSpansNodes);
  // Plain tensors go to NCCL without asking the peers (they pass plain
  // tensors too, or the call numbers stop matching and the group fails),
  // unless the algorithm reads no peer's buffer: a small all-reduce runs
  // low-latency on any memory, faster than NCCL, and leaves the next call
  // no alignment check to make.
  const bool any_memory =
      kind == CollectiveKind::kAllReduce && comm->all_reduce_takes_any_memory(input.nbytes());
  if (!any_memory && (!comm->in_heap(input.data_ptr(), input.nbytes()) ||
                      !comm->in_heap(output.data_ptr(), output.nbytes()))) {
    comm->count_call_run_elsewhere();
    return nccl(RouteReason::kNotInHeap);
  }
  auto stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  const ReduceOp rop = op == c10d::ReduceOp::AVG ? ReduceOp::kAvg : ReduceOp::kSum;
  try {
    switch (kind) {
      case CollectiveKind::kAllGather:
        comm->all_gather(input.data_ptr(), output.data_ptr(), input.nbytes(), stream);
        break;
      case CollectiveKind::kReduceScatter:
        comm->reduce_scatter(input.data_ptr(), output.data_ptr(), output.numel(), *type, rop, stream);
        break;
      case CollectiveKind::kAllReduce:
        comm->all_reduce(input.data_ptr(), output.data_ptr(), output.numel(), *type, rop, stream);
        break;
    }
  } catch (const symmpool::not_symmetric_error&) {
    return nccl(RouteReason::kNotSymmetric);  // every rank saw the same check
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());  // a real failure: never hidden behind NCCL
  }
  return eligible;
}

RouteDecision CollectiveRouter::run_on_nccl_windows(CollectiveKind kind, const at::Tensor& output,
                                                    const at::Tensor& input, RouteDecision asked) {
  const RouteDecision without =
      asked.engine == Engine::kNcclWindows ? nccl(RouteReason::kNoNcclWindows) : asked;
  // A group of one has no peer to read: NCCL copies, windows or not.
  if (!nccl_windows_enabled_ || (asked.engine == Engine::kNccl && group_.getSize() < 2)) return without;
  // The group forms here, at the same call on every rank: its heap's
  // segments become windows once NCCL's communicator exists too.
  const at::Device device = input.device();
  std::optional<c10::cuda::CUDAGuard> guard;
  Communicator* comm = communicator_on(device, guard);
  if (!comm) return nccl(RouteReason::kGroupSpansNodes);
  // Windows form, and change, at collective points: every rank sees the same.
  const NcclWindows* windows = windows_();
  if (windows == nullptr || windows->empty()) return without;
  if (!comm->in_heap(input.data_ptr(), input.nbytes()) ||
      !comm->in_heap(output.data_ptr(), output.nbytes())) {
    if (asked.engine == Engine::kNccl) return asked;  // plain tensors, as the table said
    comm->count_call_run_elsewhere();
    return nccl(RouteReason::kNotInHeap);
  }
  auto stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  try {
    if (!comm->meet_before_nccl(to_string(kind), input.data_ptr(), input.nbytes(), output.data_ptr(),
                                output.nbytes(), stream))
      return nccl(RouteReason::kNotSymmetric);  // every rank saw the same check
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());  // a real failure: never hidden behind NCCL
  }
  return {Engine::kNcclWindows, asked.reason};
}

// The device is nearly always current already: a guard on every call costs
// two cudaGetDevice calls and a primary-context check, each visible in an
// eager small all-reduce's host time. The current context, read from the
// driver, is a thread-local.
Communicator* CollectiveRouter::communicator_on(const at::Device& device,
                                                std::optional<c10::cuda::CUDAGuard>& guard) {
  if (!in_device_context()) {
    guard.emplace(device);
    CUcontext current = nullptr;
    if (real_driver().cuCtxGetCurrent(&current) == CUDA_SUCCESS && current != nullptr)
      device_context_.store(current);
  }
  return call_translating_errors([&] { return communicator_(device.index()); });
}

bool CollectiveRouter::in_device_context() const {
  CUcontext current = nullptr;
  if (real_driver().cuCtxGetCurrent(&current) != CUDA_SUCCESS || current == nullptr) return false;
  return current == device_context_.load();
}

void CollectiveRouter::route_several(CollectiveKind kind, const std::vector<at::Tensor>& tensors) {
  std::size_t bytes = 0;
  if (trace_)
    for (const at::Tensor& t : tensors) bytes += t.nbytes();
  record(kind, bytes, nccl(RouteReason::kSeveralTensors));
}

void CollectiveRouter::record(CollectiveKind kind, std::size_t bytes, RouteDecision decision) const {
  const std::uint64_t seen =
      decisions[static_cast<int>(decision.reason)].fetch_add(1, std::memory_order_relaxed) + 1;
  if (decision.engine == Engine::kNcclWindows) on_windows.fetch_add(1, std::memory_order_relaxed);
  if (!trace_) return;
  const std::string& name = group_.getGroupDesc().empty() ? group_.getGroupUid() : group_.getGroupDesc();
  log::write(log::Level::kInfo, log::kRouting,
             "group %s rank %d (%d ranks) %s of %zu bytes -> %s: %s (%llu so far)", name.c_str(),
             group_.getRank(), group_.getSize(), to_string(kind), bytes, to_string(decision.engine),
             to_string(decision.reason), static_cast<unsigned long long>(seen));
}

std::array<std::uint64_t, kRouteReasons> routing_counts() {
  std::array<std::uint64_t, kRouteReasons> counts{};
  for (int r = 0; r < kRouteReasons; ++r) counts[r] = decisions[r].load(std::memory_order_relaxed);
  return counts;
}

CollectiveCounts collective_counts() {
  CollectiveCounts counts;
  counts.on_nccl_windows = on_windows.load(std::memory_order_relaxed);
  const auto by_reason = routing_counts();
  for (int r = 0; r < kRouteReasons; ++r) {
    const auto reason = static_cast<RouteReason>(r);
    if (runs_on_symmpool(reason))
      counts.routed += by_reason[r];
    else if (is_nccl_fallback(reason))
      counts.fallbacks += by_reason[r];
  }
  return counts;
}

}  // namespace symmpool::torch_ext
