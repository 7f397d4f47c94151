// SymmBackend's NCCL registrations: the hooks that register every segment
// of a device's cache with the backend's NCCL communicator, and the NCCL
// symmetric windows of its heap (symm_backend.cpp has the rest of the class).

#include "c10d/symm_backend.hpp"
#include "stream_capture.hpp"
#include "torch_errors.hpp"

#include <symmpool/device_allocators.hpp>
#include <symmpool/log.hpp>
#include <symmpool/nvlink_topology.hpp>

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace symmpool::torch_ext {

void SymmBackend::register_if_ready(const at::Device& device) {
  if (!device.is_cuda()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_ && !hooks_.count(device.index())) register_locally(device);
  }
  form_windows_if_ready(device);
}

void SymmBackend::register_locally(const at::Device& device) {
  std::shared_ptr<c10d::NCCLComm> nccl_comm = getNCCLComm(std::to_string(device.index()));
  if (!nccl_comm) return;  // no collective on it yet
  // getCommPtr reads the communicator of the current device.
  c10::cuda::CUDAGuard guard(device.index());
  auto comm = reinterpret_cast<ncclComm_t>(getCommPtr());
  // ProcessGroupNCCL's watchdog aborts (and NCCL frees) a communicator whose
  // collective timed out without calling our abort(): the hook asks before
  // every NCCL call, and an aborted or failed communicator is left alone.
  // Hooks go before this backend does (detach_all), so `this` outlives it.
  auto usable = [this, nccl_comm]() mutable { return checkForNCCLErrors(nccl_comm) == nullptr; };
  auto hook = std::make_unique<NcclRegistrationHook>(comm, loaded_nccl(), std::move(usable));
  call_translating_errors([&] {
    device_allocator(device.index()).add_observer(hook.get(), /*replay_existing=*/true);
    return 0;
  });
  hooks_.emplace(device.index(), std::move(hook));
}

void SymmBackend::form_windows_if_ready(const at::Device& device) {
  if (windows_decided_ || !windows_enabled_ || !group_ || device.index() != heap_device_) return;
  // Registering a window is NCCL's own collective work on its own thread,
  // which a capture in global mode refuses (or which invalidates it): the
  // windows wait for the first call outside a capture. Captured calls are
  // the same on every rank, so every rank waits alike.
  if (is_capturing(c10::cuda::getCurrentCUDAStream(device.index()))) return;
  std::shared_ptr<c10d::NCCLComm> nccl_comm;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) return;
    nccl_comm = getNCCLComm(std::to_string(device.index()));
  }
  if (!nccl_comm) return;  // no NCCL collective on it yet: on every rank alike
  windows_decided_ = true;
  c10::cuda::CUDAGuard guard(device.index());
  auto comm = reinterpret_cast<ncclComm_t>(getCommPtr());
  SymmetricHeap& heap = group_->heap();
  // Every rank says whether it can, so that all make them or none does.
  std::string why_not;
  if (!loaded_nccl().has_windows())
    why_not = "the loaded NCCL (" + std::to_string(loaded_nccl().version) + ") has no ncclCommWindowRegister";
  else
    why_not = why_not_all_nvlink(heap.gpu_pci_addresses());
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(getOptions()->timeout);
  try {
    const std::vector<std::string> all = heap.exchange_among_ranks("nccl windows", why_not);
    for (std::size_t r = 0; r < all.size() && why_not.empty(); ++r)
      if (!all[r].empty()) why_not = "rank " + std::to_string(r) + ": " + all[r];
    if (!why_not.empty()) {
      TORCH_WARN_ONCE("symm: no NCCL symmetric windows on this group (", why_not,
                      "); NCCL keeps its local registrations");
      return;
    }
    auto usable = [this, nccl_comm]() mutable { return checkForNCCLErrors(nccl_comm) == nullptr; };
    windows_ = std::make_unique<NcclWindows>(heap, comm, loaded_nccl(), timeout, std::move(usable));
    windows_view_.store(windows_.get(), std::memory_order_release);
  } catch (const std::exception& e) {
    // Sticky, as a failed collective: the ranks no longer agree on NCCL's windows.
    const std::string message = std::string("symm: making NCCL windows failed on rank ") +
                                std::to_string(getRank()) + ": " + e.what() + "; the group is unusable";
    group_->communicator().abort(message);
    TORCH_CHECK(false, message);
  }
}

void SymmBackend::detach_all() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [device, hook] : hooks_) {
    try {
      device_allocator(device).remove_observer(hook.get(), /*replay_existing=*/true);
    } catch (const std::exception& e) {
      SYMMPOOL_WARN(kReg, "detaching from device %d failed: %s", int(device), e.what());
    }
  }
  hooks_.clear();
}

void SymmBackend::abandon_registrations() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;  // register_if_ready makes no new hook for the aborted communicator
  for (auto& [device, hook] : hooks_) hook->abandon();
  if (windows_) windows_->abandon();
}

RegistrationCounts SymmBackend::registration_counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  RegistrationCounts total;
  for (auto& [device, hook] : hooks_) total += hook->counts();
  return total;
}

WindowCounts SymmBackend::window_counts() const {
  const NcclWindows* windows = windows_view_.load(std::memory_order_acquire);
  return windows ? windows->counts() : WindowCounts{};
}

}  // namespace symmpool::torch_ext
