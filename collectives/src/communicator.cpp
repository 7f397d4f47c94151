#include "copy_streams.hpp"
#include "failure_monitor.hpp"
#include "issue_order.hpp"
#include "stream_op_watchdog.hpp"
#include "kernels.hpp"
#include "relaxed_capture.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/cuda_try.hpp>
#include <symmpool/detail/scope_exit.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace symmpool {

namespace {

constexpr std::size_t kPadWords = std::size_t{detail::kPadRows} * detail::kMaxRanks;

bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

const char* at(const void* p, std::size_t offset) { return static_cast<const char*>(p) + offset; }
char* at(void* p, std::size_t offset) { return static_cast<char*>(p) + offset; }

void expect_algorithm(bool ok, Algorithm a, const char* op) {
  SYMMPOOL_EXPECTS(ok, std::string("symmpool: algorithm '") + to_string(a) + "' does not apply to " + op);
}

}  // namespace

Communicator::Communicator(SymmetricHeap& heap, CachingAllocator& allocator,
                           std::chrono::seconds barrier_timeout, FailureHandler on_failure,
                           const CollectiveOptions& options)
    : heap_(heap), allocator_(allocator) {
  const int longest = static_cast<int>(kLongestBarrierTimeout.count());
  SYMMPOOL_EXPECTS(barrier_timeout.count() >= 1 && barrier_timeout.count() <= longest,
                   "symmpool: the barrier timeout must be 1 to " + std::to_string(longest) +
                       " s, got " + std::to_string(barrier_timeout.count()) + " s");
  options.check();  // from_environment() checked its own; options set in code may be off
  max_blocks_ = options.max_blocks;
  timeout_seconds_ = static_cast<int>(options.barrier_timeout.value_or(barrier_timeout).count());
  SYMMPOOL_EXPECTS(world() <= kMaxRanks, "symmpool collectives support up to " +
                                             std::to_string(kMaxRanks) + " ranks, got " +
                                             std::to_string(world()));
  int device = -1;
  SYMMPOOL_CUDA_TRY(cudaGetDevice(&device));
  SYMMPOOL_EXPECTS(device == allocator_.device(),
                   "the current device is " + std::to_string(device) + " but the heap is on device " +
                       std::to_string(allocator_.device()));
  // A group's first collective may come inside a graph capture (torch.cuda.graph
  // around a model's first step): setup must not touch any stream being captured.
  detail::RelaxedCaptureMode relaxed;
  // A constructor that throws leaves nothing behind (no slot, no host memory).
  detail::ScopeExit undo([this] { release_resources(); });
  const std::size_t pad_bytes = kPadWords * sizeof(std::uint32_t);
  const std::size_t epoch_bytes = (1 + detail::kMaxSyncBlocks) * sizeof(std::uint32_t);
  static_assert(kPadWords * sizeof(std::uint32_t) + (1 + detail::kMaxSyncBlocks) * sizeof(std::uint32_t) <= 4096,
                "pads and epochs fit in any internal slot");
  internal_ = heap_.allocate_internal();  // collective: the same offset on every rank
  pads_ = static_cast<std::uint32_t*>(internal_);
  kernel_epoch_ = pads_ + kPadWords;
  block_epochs_ = kernel_epoch_ + 1;
  {
    cudaStream_t setup = nullptr;  // private: a device-wide sync would break a capture
    SYMMPOOL_CUDA_TRY(cudaStreamCreateWithFlags(&setup, cudaStreamNonBlocking));
    detail::ScopeExit destroy([setup] { cudaStreamDestroy(setup); });
    SYMMPOOL_CUDA_TRY(cudaMemsetAsync(pads_, 0, pad_bytes + epoch_bytes, setup));
    SYMMPOOL_CUDA_TRY(cudaStreamSynchronize(setup));
  }
  SYMMPOOL_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&error_words_), sizeof(detail::ErrorWords),
                                  cudaHostAllocMapped));
  *error_words_ = detail::ErrorWords{0, 0};
  error_flag_ = &error_words_->missing;
  heap_.sync();  // also a barrier: no peer signals before every pad is zeroed
  heap_.check_symmetric(pads_, pad_bytes, "signal pads");  // by construction; checked all the same
  // Fixed for the communicator's life; asking per call cost ~1 ms of host
  // time (the clock-rate query), measured on H200.
  for (int p = 0; p < world(); ++p)
    peer_pads_.peer[p] = static_cast<std::uint32_t*>(heap_.peer_ptr(pads_, p));
  int khz = 0;
  SYMMPOOL_CUDA_TRY(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, allocator_.device()));
  timeout_cycles_ = static_cast<long long>(khz) * 1000LL * timeout_seconds_;
  copies_ = std::make_unique<detail::CopyStreams>(options.copy_streams);
  order_ = std::make_unique<detail::IssueOrder>();
  if (!on_failure)
    on_failure = [](const std::string& message) { std::fprintf(stderr, "%s\n", message.c_str()); };
  monitor_ = std::make_unique<detail::FailureMonitor>(allocator_.device(), rank(), world(),
                                                      std::chrono::seconds(timeout_seconds_), error_words_,
                                                      std::move(on_failure));
  undo.dismiss();
}

Communicator::~Communicator() {
  cudaDeviceSynchronize();  // the watchdog, still running, frees streams stuck on a dead peer
  watchdog_.reset();
  monitor_.reset();
  if (scratch_) cudaFree(scratch_);
  for (void* old : retired_scratch_) cudaFree(old);
  release_resources();
}

void Communicator::release_resources() noexcept {
  if (internal_) {
    try {
      heap_.release_internal(internal_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "symmpool: releasing the signal pads failed: %s\n", e.what());
    }
  }
  internal_ = nullptr;
  if (error_words_) cudaFreeHost(error_words_);
  error_words_ = nullptr;
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

void Communicator::in_order(cudaStream_t stream, const char* op, std::size_t bytes,
                            const std::function<void()>& enqueue) {
  const unsigned long long capture = order_->begin(stream);
  try {
    enqueue();  // a throw (say, a buffer that is not symmetric) leaves the order as it was
  } catch (const not_symmetric_error&) {
    throw;  // the same verdict on every rank: the caller may use NCCL
  } catch (const logic_error&) {
    throw;  // bad arguments, found before any peer was involved
  } catch (const std::exception& e) {
    monitor_->fail(std::string(op) + " of " + std::to_string(bytes) + " bytes: " + e.what());
    throw collective_error(monitor_->record_of_failure()->message());
  }
  order_->end(stream, capture);
  monitor_->record(op, bytes, stream, capture != 0);
}

detail::BlockSync Communicator::block_sync(bool fused) const {
  detail::BlockSync s;
  s.enabled = fused;
  s.peers = peer_pads_;
  s.my_pads = pads_;
  s.block_epochs = block_epochs_;
  s.rank = heap_.rank();
  s.error_flag = error_flag_;
  s.timeout_cycles = timeout_cycles_;
  return s;
}

void Communicator::barrier(cudaStream_t stream, BarrierKind kind) {
  check_errors();
  begin_call("barrier");
  in_order(stream, "barrier", 0, [&] { enqueue_barrier(stream, kind); });
}

void Communicator::enqueue_barrier(cudaStream_t stream, BarrierKind kind) {
  const int n = world();
  // Stream-op barriers carry an epoch counted on the host, which a graph
  // would replay unchanged (every replay after the first would pass at
  // once); captured barriers count on the device instead.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SYMMPOOL_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
  if (kind == BarrierKind::kKernel || capture != cudaStreamCaptureStatusNone) {
    SYMMPOOL_CUDA_TRY(detail::launch_barrier(peer_pads_, pads_, kernel_epoch_, rank(), n,
                                             error_flag_, timeout_cycles_, stream));
    return;
  }
  // SM-free: write our epoch into each peer's pad, then wait on our own.
  const DriverApi& drv = real_driver();
  const std::uint32_t epoch = ++stream_op_epoch_;
  auto cu = reinterpret_cast<CUstream>(stream);
  constexpr int row = detail::kStreamOpBarrierRow * kMaxRanks;
  for (int p = 0; p < n; ++p) {
    auto* slot = peer_pads_.peer[p] + row + rank();
    SYMMPOOL_CU_TRY(drv, cuStreamWriteValue32(cu, reinterpret_cast<CUdeviceptr>(slot), epoch,
                                              CU_STREAM_WRITE_VALUE_DEFAULT));
  }
  for (int p = 0; p < n; ++p) {
    SYMMPOOL_CU_TRY(drv, cuStreamWaitValue32(cu, reinterpret_cast<CUdeviceptr>(pads_ + row + p),
                                             epoch, CU_STREAM_WAIT_VALUE_GEQ));
  }
  if (!watchdog_)
    watchdog_ = std::make_unique<detail::StreamOpWatchdog>(
        drv, allocator_.device(), pads_ + row, n, error_flag_, std::chrono::seconds(timeout_seconds_),
        [this](int missing) { monitor_->fail_missing(missing); });
  watchdog_->enqueue_passed(cu, epoch);
}

bool Communicator::in_heap(const void* ptr, std::size_t bytes) const {
  const char* first = static_cast<const char*>(ptr);
  return allocator_.owns(first) && (bytes == 0 || allocator_.owns(first + bytes - 1));
}

// A rank that ran a call elsewhere while a peer ran it here (not SPMD) must
// not pair its next call with that peer's on a cached verdict: the next
// check exchanges, and the call numbers it carries tell the ranks apart.
void Communicator::count_call_run_elsewhere() {
  ++calls_;
  exchange_next_check_ = true;
}

void Communicator::begin_call(const char* op) {
  call_op_ = op;
  ++calls_;
}

// Built only when a check needs it: not on every call's hot path.
std::string Communicator::call_label() const { return std::string(call_op_) + " #" + std::to_string(calls_); }

bool Communicator::is_symmetric(const void* ptr, std::size_t bytes, const char* what) {
  if (!in_heap(ptr, bytes)) return false;
  auto it = checked_.find({ptr, bytes});
  if (it != checked_.end() && !heap_.needs_sync() && !exchange_next_check_) return it->second.empty();
  // A buffer not seen yet, or segments changed here: one exchange decides
  // the verdict and, if any rank's segments changed, a sync on every rank.
  std::string why_not;
  bool synced = false;
  detail::RelaxedCaptureMode relaxed;  // may map peer segments: allowed under capture
  try {
    heap_.check_symmetric_and_sync(ptr, bytes, call_label() + " " + what, /*sync_if_needed=*/true, &synced);
  } catch (const not_symmetric_error& e) {
    why_not = e.what();  // the same verdict on every rank
  }
  exchange_next_check_ = false;
  if (synced) checked_.clear();
  checked_[{ptr, bytes}] = why_not;
  return why_not.empty();
}

void Communicator::require_symmetric(const void* ptr, std::size_t bytes, const char* what) {
  if (is_symmetric(ptr, bytes, what)) return;
  auto it = checked_.find({ptr, bytes});
  throw not_symmetric_error(it != checked_.end()
                                ? it->second
                                : "symmpool " + call_label() + ": buffer '" + what + "' (" + std::to_string(bytes) +
                                      " bytes) is not in the symmetric heap of rank " + std::to_string(rank()));
}

float Communicator::scale(ReduceOp op) const {
  return op == ReduceOp::kAvg ? 1.0f / static_cast<float>(world()) : 1.0f;
}

void Communicator::all_gather(const void* in, void* out, std::size_t bytes_per_rank,
                              cudaStream_t stream, Algorithm algorithm, BarrierKind kind) {
  check_errors();
  begin_call("all_gather");
  if (bytes_per_rank == 0) return;
  in_order(stream, "all_gather", bytes_per_rank * static_cast<std::size_t>(world()),
           [&] { enqueue_all_gather(in, out, bytes_per_rank, stream, algorithm, kind); });
}

void Communicator::enqueue_all_gather(const void* in, void* out, std::size_t bytes_per_rank,
                                      cudaStream_t stream, Algorithm algorithm, BarrierKind kind) {
  const int n = world(), me = rank();
  const std::size_t total = bytes_per_rank * static_cast<std::size_t>(n);
  if (algorithm == Algorithm::kAuto)
    algorithm = choose_algorithm(CollectiveKind::kAllGather, total, n);
  expect_algorithm(algorithm == Algorithm::kCopyEnginePull || algorithm == Algorithm::kCopyEnginePush ||
                       algorithm == Algorithm::kKernel,
                   algorithm, "all_gather");
  auto slice = [&](int p) { return static_cast<std::size_t>(p) * bytes_per_rank; };
  // In place (FSDP2's way), each rank's input is its own slice of the output,
  // so peer p's input is its output's slice p; otherwise the inputs must be
  // symmetric themselves.
  const bool in_place = in == at(out, slice(me));
  if (in_place || algorithm == Algorithm::kCopyEnginePush)
    require_symmetric(out, total, "all_gather output");
  if (!in_place && algorithm != Algorithm::kCopyEnginePush)
    require_symmetric(in, bytes_per_rank, "all_gather input");
  auto peer_input = [&](int p) {
    return in_place ? at(heap_.peer_ptr(out, p), slice(p)) : static_cast<const char*>(heap_.peer_ptr(in, p));
  };

  if (algorithm == Algorithm::kKernel) {
    detail::PeerPointers src{};
    for (int p = 0; p < n; ++p) src.ptr[p] = p == me ? in : peer_input(p);
    SYMMPOOL_CUDA_TRY(detail::launch_gather_copy(block_sync(true), src, static_cast<char*>(out),
                                                 bytes_per_rank, n, stream));
    return;
  }
  std::vector<detail::Copy> copies;
  for (int k = 1; k < n; ++k) {
    const int p = (me + k) % n;  // spread the copies over the links
    if (algorithm == Algorithm::kCopyEnginePull)
      copies.push_back({at(out, slice(p)), peer_input(p), bytes_per_rank});
    else
      copies.push_back({at(heap_.peer_ptr(out, p), slice(me)), in, bytes_per_rank});
  }
  if (!in_place) copies.push_back({at(out, slice(me)), in, bytes_per_rank});
  enqueue_barrier(stream, kind);  // inputs ready and outputs free everywhere
  copies_->issue(copies, stream);
  enqueue_barrier(stream, kind);  // every copy landed; nobody reuses a buffer a peer still reads
}

// Plain device memory: peers never read it, and taking it from the heap
// would map segments on some ranks only (a timing-dependent reuse decides),
// which breaks the ranks' equal layouts.
void* Communicator::scratch(std::size_t bytes, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SYMMPOOL_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
  const bool capturing = capture != cudaStreamCaptureStatusNone;
  if (scratch_bytes_ < bytes) {
    detail::RelaxedCaptureMode relaxed;
    if (scratch_ && (scratch_captured_ || capturing)) {
      retired_scratch_.push_back(scratch_);  // a graph may use it: kept until we go
    } else if (scratch_) {
      SYMMPOOL_CUDA_TRY(cudaFree(scratch_));  // synchronizes with queued work that uses it
    }
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    scratch_captured_ = false;
    SYMMPOOL_CUDA_TRY(cudaMalloc(&scratch_, bytes));
    scratch_bytes_ = bytes;
  }
  scratch_captured_ = scratch_captured_ || capturing;
  return scratch_;
}

void Communicator::one_shot(const void* in, std::size_t in_count, void* out, std::size_t count,
                            std::size_t src_offset, DataType type, float scale, cudaStream_t stream) {
  const std::size_t es = element_size(type);
  require_symmetric(in, in_count * es, "reduction input");
  detail::PeerPointers peers{};
  for (int p = 0; p < world(); ++p) peers.ptr[p] = heap_.peer_ptr(in, p);
  // Peers read our input until the end: results that would land on it go to
  // scratch first.
  const bool aliased = overlap(in, in_count * es, out, count * es);
  detail::OutPointers dst{};
  dst.ptr[0] = aliased ? scratch(count * es, stream) : out;
  const bool fused = fused_kernel(count * es);
  if (!fused) enqueue_barrier(stream, BarrierKind::kKernel);
  SYMMPOOL_CUDA_TRY(detail::launch_reduce(block_sync(fused), peers, src_offset, dst, 1, 0, count,
                                          count, world(), type, scale, max_blocks_, stream));
  if (!fused) enqueue_barrier(stream, BarrierKind::kKernel);
  if (aliased) detail::copy_on(stream, out, dst.ptr[0], count * es);
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

void Communicator::two_step(const void* in, void* out, std::size_t count, DataType type,
                            float scale, cudaStream_t stream) {
  const std::size_t es = element_size(type), bytes = count * es;
  const int n = world(), me = rank();
  require_symmetric(in, bytes * static_cast<std::size_t>(n), "reduce_scatter input");
  // Copy engines bring every rank's chunk `me` here; then peers are free and
  // an SM kernel reduces from local memory only.
  char* staged = static_cast<char*>(scratch(bytes * static_cast<std::size_t>(n), stream));
  std::vector<detail::Copy> copies;
  for (int k = 1; k < n; ++k) {
    const int p = (me + k) % n;
    copies.push_back({staged + static_cast<std::size_t>(p) * bytes,
                      at(heap_.peer_ptr(in, p), bytes * static_cast<std::size_t>(me)), bytes});
  }
  enqueue_barrier(stream, BarrierKind::kKernel);
  copies_->issue(copies, stream);
  enqueue_barrier(stream, BarrierKind::kKernel);
  detail::PeerPointers chunks{};
  for (int p = 0; p < n; ++p) chunks.ptr[p] = staged + static_cast<std::size_t>(p) * bytes;
  chunks.ptr[me] = at(in, bytes * static_cast<std::size_t>(me));  // read in place: same index, same thread
  detail::OutPointers dst{};
  dst.ptr[0] = out;
  if (overlap(in, bytes * static_cast<std::size_t>(n), out, bytes) && out != chunks.ptr[me]) {
    detail::copy_on(stream, staged + static_cast<std::size_t>(me) * bytes, chunks.ptr[me], bytes);
    chunks.ptr[me] = staged + static_cast<std::size_t>(me) * bytes;
  }
  SYMMPOOL_CUDA_TRY(detail::launch_reduce(block_sync(false), chunks, 0, dst, 1, 0, count, count, n,
                                          type, scale, max_blocks_, stream));
}

void Communicator::reduce_scatter(const void* in, void* out, std::size_t count, DataType type,
                                  ReduceOp op, cudaStream_t stream, Algorithm algorithm) {
  check_errors();
  begin_call("reduce_scatter");
  if (count == 0) return;
  in_order(stream, "reduce_scatter", count * static_cast<std::size_t>(world()) * element_size(type),
           [&] { enqueue_reduce_scatter(in, out, count, type, op, stream, algorithm); });
}

void Communicator::enqueue_reduce_scatter(const void* in, void* out, std::size_t count, DataType type,
                                          ReduceOp op, cudaStream_t stream, Algorithm algorithm) {
  const std::size_t n = static_cast<std::size_t>(world());
  if (algorithm == Algorithm::kAuto)
    algorithm = choose_algorithm(CollectiveKind::kReduceScatter, count * n * element_size(type), world());
  expect_algorithm(algorithm == Algorithm::kOneShot || algorithm == Algorithm::kTwoStep, algorithm,
                   "reduce_scatter");
  if (algorithm == Algorithm::kTwoStep)
    two_step(in, out, count, type, scale(op), stream);
  else
    one_shot(in, count * n, out, count, count * static_cast<std::size_t>(rank()), type, scale(op), stream);
}

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
  expect_algorithm(algorithm == Algorithm::kOneShot || algorithm == Algorithm::kTwoShot, algorithm,
                   "all_reduce");
  if (algorithm == Algorithm::kTwoShot) {
    // Two-shot writes peers' outputs while they read our input: the buffers
    // must be the same one or apart, and the output symmetric.
    // Both checks run on every rank (they are collective): no short circuit.
    const bool in_symmetric = is_symmetric(in, bytes, "all_reduce input");
    const bool out_symmetric = is_symmetric(out, bytes, "all_reduce output");
    const bool usable = in_symmetric && out_symmetric && (in == out || !overlap(in, bytes, out, bytes));
    SYMMPOOL_EXPECTS(usable || !explicit_choice,
                     "symmpool: two-shot all_reduce needs symmetric input and output that are the "
                     "same buffer or do not overlap");
    if (usable) return two_shot(in, out, count, type, scale(op), stream);
  }
  one_shot(in, count, out, count, 0, type, scale(op), stream);
}

}  // namespace symmpool
