// CachingAllocator in stream order: the events a block freed on another
// stream (or used on one, record_stream) waits for before reuse, their
// retries where recording failed, and whether a stream captures.

#include "caching_allocator_block.hpp"

#include <symmpool/error.hpp>
#include <symmpool/log.hpp>

#include <algorithm>
#include <exception>

namespace symmpool {

void CachingAllocator::record_events(Block* block) {
  ContextGuard guard(drv_, arena_->context());
  // A stream leaves stream_uses only once its event is recorded, so a failure
  // keeps the block unfree. An event recorded later than the free still
  // covers all the work queued before it, so retrying is safe.
  while (!block->stream_uses.empty()) {
    CUevent event = take_event();
    CUresult r = drv_.cuEventRecord(event, block->stream_uses.back());
    if (r != CUDA_SUCCESS) {
      spare_events_.push_back(event);
      detail::throw_cuda_error(__FILE__, __LINE__, "cuEventRecord", r, drv_.error_string(r));
    }
    pending_.emplace_back(event, block);
    ++block->pending_events;
    block->stream_uses.pop_back();
  }
}

void CachingAllocator::retry_unrecorded_events() {
  if (routing_to_private_pool()) return;  // see release
  while (!unrecorded_.empty()) {
    record_events(unrecorded_.back());  // on failure the block stays listed
    unrecorded_.pop_back();
  }
}

CUevent CachingAllocator::take_event() {
  if (!spare_events_.empty()) {
    CUevent e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  CUevent e = nullptr;
  SYMMPOOL_CU_TRY(drv_, cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  return e;
}

// Best effort: the failure was reported by the free, and the blocks stay out
// of the pool until a retry succeeds.
void CachingAllocator::try_retry_unrecorded_events() {
  try {
    retry_unrecorded_events();
  } catch (const cuda_error&) {
  }
}

void CachingAllocator::process_events() {
  try_retry_unrecorded_events();
  if (!retiring_.empty()) finish_retiring(/*wait=*/false);
  if (pending_.empty()) return;
  ContextGuard guard(drv_, arena_->context());
  for (auto it = pending_.begin(); it != pending_.end();) {
    CUresult r = drv_.cuEventQuery(it->first);
    if (r == CUDA_ERROR_NOT_READY) {
      ++it;
      continue;
    }
    if (r != CUDA_SUCCESS)
      detail::throw_cuda_error(__FILE__, __LINE__, "cuEventQuery", r, drv_.error_string(r));
    spare_events_.push_back(it->first);
    Block* block = it->second;
    it = pending_.erase(it);
    --block->pending_events;
    if (block->is_free()) free_at_last(block);
  }
}

void CachingAllocator::synchronize_events() {
  retry_unrecorded_events();  // a failure here is reported: we cannot wait for those blocks
  synchronize_pending_events();
}

void CachingAllocator::synchronize_pending_events() {
  if (pending_.empty()) return;
  ContextGuard guard(drv_, arena_->context());
  for (auto& [event, block] : pending_) SYMMPOOL_CU_TRY(drv_, cuEventSynchronize(event));
  process_events();
}

// A capture on `stream`, or no answer from the driver: either way no event
// recorded outside the graph can order its work.
bool CachingAllocator::capturing(CUstream stream) const {
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  return drv_.cuStreamIsCapturing(stream, &capture) != CUDA_SUCCESS ||
         capture != CU_STREAM_CAPTURE_STATUS_NONE;
}

// An event recorded on `stream` now, for the steps that save memory; null
// where the stream captures or the event cannot be made or recorded (saving
// memory is not worth failing the request for).
CUevent CachingAllocator::record_outside_capture(CUstream stream) {
  if (capturing(stream)) return nullptr;
  CUevent event = nullptr;
  try {
    event = take_event();
  } catch (const std::exception&) {
    return nullptr;
  }
  if (drv_.cuEventRecord(event, stream) != CUDA_SUCCESS) {
    spare_events_.push_back(event);
    return nullptr;
  }
  return event;
}

}  // namespace symmpool
