// The communicator's core: construction and teardown, failures, the
// collectives' entry points, the order they run in, their numbering and the
// symmetry checks. Each call is handed to its algorithms (algorithms.hpp:
// all_gather.cpp; reduce_scatter.cpp and all_reduce.cpp, which pick among
// one_shot.cpp, two_shot.cpp, two_step.cpp and low_latency.cpp) through
// what they see of it (algorithm_context.cpp); barrier.cpp holds the
// meetings, peer_memory.cpp serves patterns users write themselves.

#include "algorithms.hpp"
#include "call_check.hpp"
#include "call_end_word.hpp"
#include "capture_state.hpp"
#include "collective_helpers.hpp"
#include "copy_streams.hpp"
#include "event_pool.hpp"
#include "failure_monitor.hpp"
#include "issue_order.hpp"
#include "kernels.hpp"
#include "on_device.hpp"
#include "relaxed_capture.hpp"
#include "stream_op_watchdog.hpp"
#include "stream_pipeline.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/detail/scope_exit.hpp>
#include <symmpool/error.hpp>
#include <symmpool/log.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace symmpool {

namespace {
std::array<std::atomic<std::uint64_t>, kAlgorithmCount> enqueued_by_algorithm{};
}  // namespace

void detail::count_algorithm(Algorithm a) {
  enqueued_by_algorithm[static_cast<std::size_t>(a)].fetch_add(1, std::memory_order_relaxed);
}

std::array<std::uint64_t, kAlgorithmCount> algorithm_counts() {
  std::array<std::uint64_t, kAlgorithmCount> counts{};
  for (std::size_t a = 0; a < counts.size(); ++a)
    counts[a] = enqueued_by_algorithm[a].load(std::memory_order_relaxed);
  return counts;
}

Communicator::Communicator(SymmetricHeap& heap, CachingAllocator& allocator,
                           std::chrono::seconds barrier_timeout, FailureHandler on_failure,
                           const CollectiveOptions& options)
    : heap_(heap), allocator_(allocator), rendezvoused_(allocator) {
  call_.check = std::make_unique<detail::CallCheck>();
  const int longest = static_cast<int>(kLongestBarrierTimeout.count());
  SYMMPOOL_EXPECTS(barrier_timeout.count() >= 1 && barrier_timeout.count() <= longest,
                   "symmpool: the barrier timeout must be 1 to " + std::to_string(longest) + " s, got " +
                       std::to_string(barrier_timeout.count()) + " s");
  options.check();  // from_environment() checked its own; options set in code may be off
  tuning_.max_blocks = options.max_blocks;
  tuning_.fused_max_bytes = options.fused_max_bytes.value_or(fused_kernel_limit(world()));
  tuning_.all_reduce_preference = options.all_reduce_algorithm;
  tuning_.reduce_scatter_preference = options.reduce_scatter_algorithm;
  tuning_.two_step_piece_bytes = options.two_step_piece_bytes;
  tuning_.timeout_seconds = static_cast<int>(options.barrier_timeout.value_or(barrier_timeout).count());
  SYMMPOOL_EXPECTS(world() <= kMaxRanks, "symmpool collectives support up to " + std::to_string(kMaxRanks) +
                                             " ranks, got " + std::to_string(world()));
  int device = -1;
  SYMMPOOL_CUDA_TRY(cudaGetDevice(&device));
  SYMMPOOL_EXPECTS(device == allocator_.device(), "the current device is " + std::to_string(device) +
                                                      " but the heap is on device " +
                                                      std::to_string(allocator_.device()));
  // A group's first collective may come inside a graph capture (torch.cuda.graph
  // around a model's first step): setup must not touch any stream being captured.
  detail::RelaxedCaptureMode relaxed;
  // A constructor that throws leaves nothing behind (no slot, no host memory).
  detail::ScopeExit undo([this] { release_resources(); });
  allocate_signal_pads();
  detail::load_collective_kernels(device);  // not at a first launch behind a waiting barrier
  SYMMPOOL_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&words_.error_words), sizeof(detail::ErrorWords),
                                  cudaHostAllocMapped));
  *words_.error_words = detail::ErrorWords{0, 0, 0};
  words_.error_flag = &words_.error_words->missing;
  heap_.sync();  // also a barrier: no peer signals before every pad is zeroed
  // Ranks that prefer different algorithms, cut two-step chunks into other
  // pieces, or fuse reductions up to other sizes would meet in different
  // places (or pair one algorithm's writes with another's reads): refuse
  // that here, by name.
  auto preference = [](const std::optional<Algorithm>& a) { return a ? to_string(*a) : "table"; };
  heap_.require_same_setting(
      "the collectives' settings (SYMMPOOL_ALL_REDUCE_ALGORITHM, "
      "SYMMPOOL_REDUCE_SCATTER_ALGORITHM, SYMMPOOL_TWO_STEP_PIECE_BYTES, SYMMPOOL_FUSED_MAX_BYTES)",
      std::string("all_reduce ") + preference(tuning_.all_reduce_preference) + ", reduce_scatter " +
          preference(tuning_.reduce_scatter_preference) + ", two-step pieces of " +
          std::to_string(tuning_.two_step_piece_bytes) + " bytes, reductions fused " +
          (tuning_.fused_max_bytes == kAnySize
               ? std::string("at every size")
               : "up to " + std::to_string(tuning_.fused_max_bytes) + " bytes a peer"));
  map_signal_pads();
  copies_ = std::make_unique<detail::EagerAndCaptured<detail::CopyStreams>>(options.copy_streams);
  pipelines_ = std::make_unique<detail::EagerAndCaptured<detail::StreamPipeline>>();
  ends_.events = detail::EventPool::make();
  ends_.word = detail::CallEndWord::make_if_supported(allocator_.device());
  order_ = std::make_unique<detail::IssueOrder>(ends_.word.get());
  if (!on_failure)
    on_failure = [](const std::string& message) { SYMMPOOL_WARN(kColl, "%s", message.c_str()); };
  monitor_ = std::make_unique<detail::FailureMonitor>(
      allocator_.device(), rank(), world(), std::chrono::seconds(tuning_.timeout_seconds), words_.error_words,
      std::move(on_failure), ends_.word.get());
  undo.dismiss();
}

Communicator::~Communicator() {
  // On our device, whichever one the destroying thread has current (a group
  // torn down from another thread, or one made without set_device): a sync
  // of another device would let kernels still using the pads run on.
  const detail::OnDevice on_our_device(allocator_.device(), std::nothrow);
  // The watchdog, still running, frees streams stuck on a dead peer. Where the
  // sync fails (a sticky error, a capture open on this thread), kernels may
  // still use the pads unmapped below: say so rather than pass in silence.
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
    SYMMPOOL_WARN(kColl, "rank %d: device sync before releasing the communicator failed: %s", rank(),
                  cudaGetErrorString(e));
  watchdog_.reset();
  monitor_.reset();
  if (scratch_.ptr) cudaFree(scratch_.ptr);
  for (void* old : scratch_.retired) cudaFree(old);
  release_resources();
}

void Communicator::release_resources() noexcept {
  if (words_.internal) {
    try {
      heap_.release_internal(words_.internal);
    } catch (const std::exception& e) {
      SYMMPOOL_WARN(kColl, "releasing the signal pads failed: %s", e.what());
    }
  }
  words_.internal = nullptr;
  if (words_.error_words) cudaFreeHost(words_.error_words);
  words_.error_words = nullptr;
}

void Communicator::check_errors() {
  monitor_->poll();
  const auto& record = monitor_->record_of_failure();
  if (record->failed()) throw collective_error(record->message());
}

std::shared_ptr<const detail::FailureRecord> Communicator::failure() const {
  return monitor_->record_of_failure();
}

void Communicator::abort(const std::string& reason) { monitor_->fail(reason); }

std::uint64_t Communicator::issued() const { return monitor_->issued(); }

void Communicator::all_gather(const void* in, void* out, std::size_t bytes_per_rank, cudaStream_t stream,
                              Algorithm algorithm, BarrierKind kind) {
  all_gather_in_order(in, out, bytes_per_rank, stream, algorithm, kind, nullptr);
}

void Communicator::all_gather_staged(const void* local, void* stage, void* out, std::size_t bytes_per_rank,
                                     cudaStream_t stream, Algorithm algorithm, BarrierKind kind) {
  all_gather_in_order(stage, out, bytes_per_rank, stream, algorithm, kind, local);
}

void Communicator::all_gather_in_order(const void* in, void* out, std::size_t bytes_per_rank,
                                       cudaStream_t stream, Algorithm algorithm, BarrierKind kind,
                                       const void* stage_from) {
  check_errors();
  begin_call("all_gather");
  if (bytes_per_rank == 0) return;
  in_order(stream, "all_gather", bytes_per_rank * static_cast<std::size_t>(world()),
           [&] { detail::all_gather(*this, in, out, bytes_per_rank, stream, algorithm, kind, stage_from); });
}

void Communicator::reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                                  cudaStream_t stream, Algorithm algorithm) {
  check_errors();
  begin_call("reduce_scatter");
  if (count == 0) return;
  const detail::Reduction r{in, out, count, type, detail::reduction_scale(op, world()), stream};
  in_order(stream, "reduce_scatter", r.bytes() * static_cast<std::size_t>(world()),
           [&] { detail::reduce_scatter(*this, r, algorithm); });
}

void Communicator::all_reduce(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                              cudaStream_t stream, Algorithm algorithm) {
  check_errors();
  begin_call("all_reduce");
  if (count == 0) return;
  const detail::Reduction r{in, out, count, type, detail::reduction_scale(op, world()), stream};
  in_order(stream, "all_reduce", r.bytes(), [&] { detail::all_reduce(*this, r, algorithm); });
}

bool Communicator::all_reduce_takes_any_memory(std::size_t bytes) const {
  return detail::auto_all_reduce_algorithm(tuning_, world(), bytes) == Algorithm::kLowLatency &&
         bytes <= low_latency_max_bytes();
}

void Communicator::in_order(cudaStream_t stream, const char* op, std::size_t bytes,
                            const std::function<void()>& enqueue) {
  const unsigned long long capture = order_->begin(stream);
  call_.capture = capture;
  ends_.at_word = false;
  detail::ScopeExit call_ended([this] { call_.capture = 0; });
  try {
    // A rank that ran its last call elsewhere first proves that its peers
    // are at this same call: an algorithm that makes no symmetry exchange
    // (low-latency, a barrier) would otherwise pair the ranks' different calls.
    if (call_.exchange_next_check) {
      detail::RelaxedCaptureMode relaxed;  // host-only work: allowed under capture
      heap_.check_same_call(call_label());
      call_.exchange_next_check = false;
    }
    enqueue();  // a throw (say, a buffer that is not symmetric) leaves the order as it was
  } catch (const not_symmetric_error&) {
    throw;  // the same verdict on every rank: the caller may use NCCL
  } catch (const logic_error&) {
    throw;  // bad arguments, found before any peer was involved
  } catch (const std::exception& e) {
    monitor_->fail(std::string(op) + " of " + std::to_string(bytes) + " bytes: " + e.what());
    throw collective_error(monitor_->record_of_failure()->message());
  }
  if (ends_.at_word) {  // its kernel writes call_.number into the end word as its last act
    order_->end_at_word(stream, call_.number);
    monitor_->record_ending_at_word(op, bytes, call_.number);
    ends_.word_ended_stream = stream;
    return;
  }
  // One event marks the end for the next collective, the flight record and
  // the caller's Work.
  detail::SharedEvent done = ends_.events->record(stream);
  order_->end(stream, capture, done);
  monitor_->record(op, bytes, done, capture != 0);
  ends_.last = std::move(done);
}

bool Communicator::in_heap(const void* ptr, std::size_t bytes) const {
  const char* first = static_cast<const char*>(ptr);
  return allocator_.owns(first) && (bytes == 0 || allocator_.owns(first + bytes - 1));
}

// A rank that ran a call elsewhere while a peer ran it here (not SPMD) must
// not pair its next call with that peer's: its next call here starts with
// an exchange (in_order), and the call numbers it carries tell the ranks apart.
void Communicator::count_call_run_elsewhere() {
  ++call_.number;
  call_.exchange_next_check = true;
}

detail::SharedEvent Communicator::take_end_of_last_call() {
  if (!ends_.last && ends_.word_ended_stream) {
    // Nothing was enqueued since the call: an event now marks its end (the
    // pool may make one: on our device, whichever the caller has current).
    const detail::OnDevice on_our_device(allocator_.device());
    ends_.last = ends_.events->record(*ends_.word_ended_stream);
  }
  ends_.word_ended_stream.reset();
  return std::move(ends_.last);
}

void Communicator::begin_call(const char* op) {
  ends_.last.reset();  // a call that enqueues nothing has no end
  ends_.word_ended_stream.reset();
  call_.op = op;
  ++call_.number;
  call_.check->begin(call_.number, op);
}

// Built only when a check needs it: not on every call's hot path.
std::string Communicator::call_label() const {
  return std::string(call_.op) + " #" + std::to_string(call_.number);
}

bool Communicator::is_symmetric(const void* ptr, std::size_t bytes, const char* what) {
  if (!in_heap(ptr, bytes)) return false;
  // Verdicts hold until release_cached unmaps published segments, on every
  // rank at once. A segment this rank mapped or unmapped alone (an
  // allocation its peers did not make, a local empty_cache) changes no
  // verdict: asking the peers then, on this rank only, would wait for an
  // exchange they never make.
  const std::uint64_t releases = heap_.releases();
  if (releases != verdicts_.releases_at) {
    verdicts_.checked.clear();
    verdicts_.releases_at = releases;
  }
  auto it = verdicts_.checked.find({ptr, bytes});
  if (it != verdicts_.checked.end()) return counted_in_call_check(ptr, bytes, it->second.empty());
  // A buffer not seen yet: one exchange decides the verdict and, if any
  // rank's segments changed since its last sync, a sync on every rank.
  std::string why_not;
  bool synced = false;
  detail::RelaxedCaptureMode relaxed;  // may map peer segments: allowed under capture
  SymmetricHeap::DeviceWaitsForbidden no_waits(heap_, capturing());  // a wait would end the capture
  try {
    heap_.check_symmetric_and_sync(ptr, bytes, call_label() + " " + what, /*sync_if_needed=*/true, &synced);
  } catch (const not_symmetric_error& e) {
    why_not = e.what();  // the same verdict on every rank
  }
  if (synced) verdicts_.checked.clear();
  verdicts_.checked[{ptr, bytes}] = why_not;
  return counted_in_call_check(ptr, bytes, why_not.empty());
}

// Peers address a symmetric buffer at our offset: the call's first meeting
// compares it with theirs, cached verdict or not. One found not symmetric
// lies at another offset on each rank and is not handed to peers (the call
// falls back, one-shot or NCCL): it counts as such, alike on every rank.
bool Communicator::counted_in_call_check(const void* ptr, std::size_t bytes, bool symmetric) {
  constexpr std::size_t kNotSymmetric = ~std::size_t{0};
  call_.check->add_buffer(
      symmetric ? reinterpret_cast<std::uintptr_t>(ptr) - allocator_.va_base() : kNotSymmetric, bytes);
  return symmetric;
}

void Communicator::require_symmetric(const void* ptr, std::size_t bytes, const char* what) {
  if (is_symmetric(ptr, bytes, what)) return;
  auto it = verdicts_.checked.find({ptr, bytes});
  throw not_symmetric_error(
      it != verdicts_.checked.end()
          ? it->second
          : "symmpool " + call_label() + ": buffer '" + what + "' (" + std::to_string(bytes) +
                " bytes) is not in the symmetric heap of rank " + std::to_string(rank()));
}

}  // namespace symmpool
