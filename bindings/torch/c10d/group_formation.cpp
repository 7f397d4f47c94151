#include "c10d/group_formation.hpp"

#include "c10d/c10d_store.hpp"

#include <symmpool/device_allocators.hpp>
#include <symmpool/error.hpp>
#include <symmpool/log.hpp>

#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace symmpool::torch_ext {

namespace {

// TORCH_NCCL_ASYNC_ERROR_HANDLING, read as ProcessGroupNCCL reads it
// (default 3, SkipCleanUp): 1 and 3 tear the process down on a failed
// collective, 0 and 2 leave it to the next wait() or collective to raise.
bool failure_aborts_process() {
  const char* value = std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  const int mode = value && *value ? std::atoi(value) : 3;
  return mode == 1 || mode == 3;
}

}  // namespace

FormedGroup form_symmetric_group(const GroupFormation& f,
                                 std::shared_ptr<const detail::FailureRecord>* failure) {
  const c10d::Backend& group = *f.group;
  // Every wait on a peer (store keys, barriers) gets the group's timeout, as
  // NCCL's collectives do; whole seconds, at least one.
  const std::chrono::seconds timeout(std::clamp<std::int64_t>((f.timeout.count() + 999) / 1000, 1,
                                                              Communicator::kLongestBarrierTimeout.count()));
  // The first routed collective may come inside torch.cuda.graph: setup
  // (address reservations, mappings, host allocations) touches no captured
  // stream, so let it run, as ProcessGroupNCCL does for NCCL's setup.
  c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
  FormedGroup formed;
  formed.store = std::make_unique<C10dStore>(f.store);
  SymmetricGroupOptions options;
  options.collectives = f.collectives;
  options.forms_in_capture =
      c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  options.same_on_every_rank = f.same_on_every_rank;
  options.heap_timeout = timeout;
  options.barrier_timeout = timeout;
  // As ProcessGroupNCCL's watchdog: say what failed, then tear the process
  // down where TORCH_NCCL_ASYNC_ERROR_HANDLING asks, before any stream gets
  // past the failed collective.
  const bool abort_process = failure_aborts_process();
  log::set_rank(group.getRank());  // for the prefix of every message from here on
  options.on_failure = [abort_process, rank = group.getRank()](const std::string& message) {
    SYMMPOOL_WARN(kColl, "%s", message.c_str());
    if (abort_process) {
      SYMMPOOL_WARN(
          kColl,
          "rank %d: aborting the process (TORCH_NCCL_ASYNC_ERROR_HANDLING; set it to 0 to raise from "
          "wait() and the next collective instead)",
          rank);
      std::fflush(stderr);
      std::abort();
    }
  };
  try {
    // The heap is named after the process group: the heap counts its
    // formations per name (a re-created group gets fresh store keys), and
    // torch names a group alike on its ranks only.
    const std::string name = group.getGroupUid().empty() ? "heap" : "heap-" + group.getGroupUid();
    formed.group =
        std::make_unique<SymmetricGroup>(real_driver(), device_allocator(f.device), *formed.store, name,
                                         group.getRank(), group.getSize(), std::move(options));
  } catch (const multi_node_error& e) {
    // Every rank saw the same hellos, so every rank gives up here together.
    TORCH_WARN_ONCE("symm: ", e.what(), "; this group's collectives run on NCCL");
    return formed;
  } catch (const std::exception& e) {
    // Sticky, as a failed NCCL communicator: a retry would form the heap
    // again with peers that may be anywhere in theirs.
    // A rank whose router never sends a call to symmpool never comes.
    const char* hint = dynamic_cast<const timeout_error*>(&e)
                           ? " (every rank forms it at its first collective that may run on symmpool: one "
                             "with SYMMPOOL_COLLECTIVES=0 never does)"
                           : "";
    const std::string message = std::string("symm: the group's symmetric heap did not form on rank ") +
                                std::to_string(group.getRank()) + " of " + std::to_string(group.getSize()) +
                                ": " + e.what() + hint + "; the group is unusable";
    auto record = std::make_shared<detail::FailureRecord>();
    record->set(message);
    *failure = std::move(record);
    if (*hint) throw timeout_error(message);  // the hint in the first error too, not only the later ones
    throw;
  }
  *failure = formed.group->communicator().failure();
  return formed;
}

}  // namespace symmpool::torch_ext
