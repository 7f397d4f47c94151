#pragma once
// Zero-copy intra-node collectives on a symmetric heap. Every call is
// collective (all ranks, same order, same sizes, same algorithm), runs on
// the caller's stream after the communicator's previous call, whatever that
// call's stream (as NCCL orders one communicator's work), can be captured in a CUDA graph once its buffers
// were seen eagerly, and checks that its buffers are symmetric before touching a peer. Algorithms
// (collective_types.hpp):
//   all_gather     copy-engine pull or push (no SM), or one kernel for small messages
//   reduce_scatter one-shot kernel (16-byte loads, fp32 accumulation) or
//                  two-step (copy engines pull, local reduce, pipelined)
//   all_reduce     one-shot, two-shot (reduce a chunk, push it everywhere),
//                  two-step (copy engines pull a chunk, local reduce, copy
//                  engines push it everywhere, pipelined), or low-latency for
//                  small messages (flagged packets, no barrier)
//   barrier        kernel or stream memory operations on signal pads
// Kernels of small messages meet their peers inside (one launch per call);
// larger ones are bracketed by barrier kernels. CollectiveOptions
// (collective_options.hpp: SYMMPOOL_MAX_BLOCKS, SYMMPOOL_COPY_STREAMS,
// SYMMPOOL_BARRIER_TIMEOUT, SYMMPOOL_ALL_REDUCE_ALGORITHM,
// SYMMPOOL_REDUCE_SCATTER_ALGORITHM, SYMMPOOL_TWO_STEP_PIECE_BYTES), read from the
// environment once and given at construction, cap the grid of the larger
// reductions, split copy-engine copies over streams, may override how long
// any barrier waits for a peer before it gives up, and may prefer an
// all-reduce algorithm to the table's.
//
// Failures are sticky: once a barrier gave up on a peer, or a heap exchange
// failed, the communicator is failed for good. The failure handler hears it
// once (with the collective's sequence number, operation, size and the
// missing rank) before the stalled stream may go on; every later call
// raises collective_error with the same text. Buffers that are not
// symmetric raise not_symmetric_error and leave the communicator sound.

#include <symmpool/collective_options.hpp>
#include <symmpool/collective_types.hpp>
#include <symmpool/detail/algorithm_context.hpp>
#include <symmpool/detail/communicator_parts.hpp>
#include <symmpool/detail/peer_pointers.hpp>
#include <symmpool/detail/shared_event.hpp>
#include <symmpool/rendezvous_registry.hpp>
#include <symmpool/symmetric_heap.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace symmpool {

namespace detail {
class CallCheck;
class CallEndWord;
class CopyStreams;
template <class Lanes>
class EagerAndCaptured;
class EventPool;
class FailureMonitor;
class FailureRecord;
class IssueOrder;
class StreamOpWatchdog;
class StreamPipeline;
struct ErrorWords;
struct ReduceLaunch;
}  // namespace detail

// Collectives enqueued so far in this process by every communicator, by
// algorithm (indexed by Algorithm): what ran, for tests and benchmarks.
std::array<std::uint64_t, kAlgorithmCount> algorithm_counts();

// Hears a communicator's failure once, from any thread, before the stalled
// stream goes on (the torch backend aborts the process here when asked).
using FailureHandler = std::function<void(const std::string& message)>;

class Communicator final : private detail::AlgorithmContext {
 public:
  static constexpr int kMaxRanks = detail::kMaxRanks;

  // c10d's default timeout for NCCL: a peer may be late for a good reason
  // (a checkpoint being written), so barriers give up late.
  static constexpr std::chrono::seconds kDefaultBarrierTimeout{600};
  static constexpr std::chrono::seconds kLongestBarrierTimeout = CollectiveOptions::kLongestBarrierTimeout;
  // The largest low-latency all-reduce, in bytes per rank: its packets
  // (twice the data) sit in the internal slot, two regions of `world` slots
  // (at 2 ranks 248 KiB fit, at 4 ranks 127 KiB: low_latency_max_bytes()).
  static constexpr std::size_t kLowLatencyMaxBytes = 128 * 1024;

  // Collective: allocates the signal pads in an internal slot of the heap
  // (the same offset on every rank whatever the ranks allocated before),
  // zeroes them, then syncs the heap. Barriers wait `barrier_timeout` for a
  // peer (the "symm" backend passes its process group's timeout);
  // options.barrier_timeout (SYMMPOOL_BARRIER_TIMEOUT) overrides it. Without
  // a handler, failures are printed to stderr. The default options are read
  // from the environment when the communicator is made; a bad value raises
  // logic_error naming its variable.
  Communicator(SymmetricHeap& heap, CachingAllocator& allocator,
               std::chrono::seconds barrier_timeout = kDefaultBarrierTimeout, FailureHandler on_failure = {},
               const CollectiveOptions& options = CollectiveOptions::from_environment());
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  void barrier(cudaStream_t stream, BarrierKind kind = BarrierKind::kKernel);

  // out holds world * bytes_per_rank; in may be out's slice of this rank.
  // `kind` is the barrier of the copy-engine algorithms.
  void all_gather(const void* in, void* out, std::size_t bytes_per_rank, cudaStream_t stream,
                  Algorithm algorithm = Algorithm::kAuto, BarrierKind kind = BarrierKind::kKernel);
  // all_gather of `local`, any device memory of this rank: it is first
  // copied into `stage`, a symmetric buffer of bytes_per_rank that the peers
  // read, within the call (the kernel algorithm stages it itself before it
  // meets the peers: one launch less than a copy and an all_gather).
  void all_gather_staged(const void* local, void* stage, void* out, std::size_t bytes_per_rank,
                         cudaStream_t stream, Algorithm algorithm = Algorithm::kAuto,
                         BarrierKind kind = BarrierKind::kKernel);
  // in holds world * count elements, out count.
  void reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                      cudaStream_t stream, Algorithm algorithm = Algorithm::kAuto);
  // Two-shot needs a symmetric `out` (in place is the usual case).
  void all_reduce(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                  cudaStream_t stream, Algorithm algorithm = Algorithm::kAuto);

  // Before the caller runs this collective on NCCL over buffers that may
  // lie in NCCL's symmetric windows, whose kernels read each peer at this
  // rank's offset: numbers the call, checks `in` and `out` symmetric
  // (cached verdicts, one exchange otherwise) and enqueues on `stream` a
  // meeting that compares the call and its buffers' offsets with every
  // peer's, so that a rank whose buffer lies elsewhere fails the group
  // instead of NCCL reading the wrong bytes (nccl_meeting.cpp). False, with
  // nothing enqueued, where a buffer is not symmetric: the same answer on
  // every rank. The caller then runs NCCL on `stream` (after the meeting).
  bool meet_before_nccl(const char* op, const void* in, std::size_t in_bytes, const void* out,
                        std::size_t out_bytes, cudaStream_t stream);

  // Peer memory, for patterns users write themselves (peer_memory.cpp).
  // Collective: checks that [ptr, ptr + bytes) lies in one live allocation
  // at the same offset and size in every rank's heap (syncing the heap first
  // where a rank's segments changed) and remembers it for peer_address.
  // Throws not_symmetric_error, the same on every rank, otherwise.
  // `stream`: the caller's; while a graph capture is open on it the sync
  // never waits for the device (the wait would end the capture).
  void rendezvous(const void* ptr, std::size_t bytes, cudaStream_t stream);
  // Local: where `peer`'s copy of [ptr, ptr + bytes) is mapped here. The
  // range must lie in one that went through rendezvous, in the allocation
  // it had then (logic_error otherwise: a buffer freed and allocated again
  // at the same address needs a new rendezvous). Valid while the buffer
  // lives on every rank; a peer's own frees cannot be seen from here.
  void* peer_address(const void* ptr, std::size_t bytes, int peer) const;
  // The same address, and what keeps its mapping alive for a view that may
  // outlive the buffer, the peer's release or this communicator
  // (SymmetricHeap::peer_view; null for this rank's own memory).
  std::pair<void*, std::shared_ptr<void>> peer_view(const void* ptr, std::size_t bytes, int peer) const;
  // Point to point, neither collective nor ordered with the collectives:
  // signal tells `peer` that what `stream` did before is done (counted, so
  // no signal is lost); wait holds `stream` until `peer` has signalled this
  // rank once more than earlier waits consumed. Eager, they are stream
  // memory operations (no SM; counted on the host); under CUDA graph capture
  // one-thread kernels counted on the device, so replays stay right. The two
  // count apart: a signal sent eagerly is consumed by an eager wait, one
  // sent in a graph by a wait in a graph. A wait gives up after the barrier
  // timeout and fails the communicator. Signals to one peer, and waits on
  // one peer, must be issued in one order (one stream, or streams ordered by
  // events).
  void signal(int peer, cudaStream_t stream);
  void wait(int peer, cudaStream_t stream);

  // Raises collective_error once the communicator failed (sticky).
  void check_errors();
  // The failure, shared so that a Work can report it after we are gone.
  std::shared_ptr<const detail::FailureRecord> failure() const;
  // Fails the communicator now (c10d abort): queued barriers give up at
  // once instead of waiting for their timeout.
  void abort(const std::string& reason);
  // Collectives issued so far (their sequence numbers run from 1).
  std::uint64_t issued() const;
  // The end of the collective just issued on this communicator (which one
  // thread at a time uses, as a NCCL communicator), recorded on its stream
  // (a c10d Work waits on it); null when that call enqueued nothing. Taken
  // once: a second call gets null. Call it from the thread that made the
  // call (cudaStreamPerThread names another stream elsewhere) before
  // anything else is enqueued on the call's stream: a call whose kernel
  // reports its own end (an eager low-latency all-reduce) records no event,
  // and gets one here, which would also cover work enqueued in between.
  detail::SharedEvent take_end_of_last_call();

  // Whether [ptr, ptr + bytes) lies in this rank's heap: local, no exchange.
  // A buffer outside is never symmetric, decided without asking the peers,
  // so a call on plain memory costs nothing here. The ranks must agree on
  // which of their buffers come from the heap, as they agree on shapes; a
  // rank that differs fails loudly (its call numbers no longer match).
  bool in_heap(const void* ptr, std::size_t bytes) const;
  // The caller ran a collective elsewhere (on NCCL, its buffers not in the
  // heap): counted like ours, so every rank's call numbers stay aligned.
  void count_call_run_elsewhere();

  int rank() const override { return heap_.rank(); }
  int world() const override { return heap_.world(); }
  // The largest all_reduce the low-latency algorithm takes here, in bytes:
  // kLowLatencyMaxBytes unless the internal slot is too small for it.
  std::size_t low_latency_max_bytes() const { return tuning_.low_latency_max_bytes; }
  // Whether an all_reduce of `bytes` left to kAuto runs an algorithm that
  // reads no peer's buffer (low-latency), so that its buffers may be any
  // device memory of this GPU: decided by the size, the world size and the
  // settings alone, the same on every rank, without asking the peers.
  bool all_reduce_takes_any_memory(std::size_t bytes) const;
  // Tests only: sets the epoch of the last low-latency call (every rank the
  // same value, with no call of this communicator in flight anywhere), so
  // that a test can reach the wrap after 2^32 calls without making them.
  void set_low_latency_epoch_for_testing(std::uint32_t last);

 private:
  // The core (communicator.cpp).
  // Enqueues on `stream` after the previous collective (IssueOrder) and
  // records it; a failure other than not_symmetric_error or bad arguments
  // fails the communicator.
  void in_order(cudaStream_t stream, const char* op, std::size_t bytes, const std::function<void()>& enqueue);
  // Whether the call in_order is enqueueing goes into a CUDA graph capture:
  // asked of the driver once per call, when it begins.
  bool capturing() const override { return call_.capture != 0; }
  // Shared verdicts: one exchange per buffer not seen before (or after a
  // sync), tagged with the call number, so ranks at different calls fail
  // loudly instead of pairing up; a buffer outside the heap needs none.
  void require_symmetric(const void* ptr, std::size_t bytes, const char* what) override;
  bool is_symmetric(const void* ptr, std::size_t bytes, const char* what) override;
  // Adds the buffer to the call's digest (call_check.hpp); returns `symmetric`.
  bool counted_in_call_check(const void* ptr, std::size_t bytes, bool symmetric);
  void begin_call(const char* op);    // numbers a collective
  std::string call_label() const;     // "<op> #<number>" of the current call
  void release_resources() noexcept;  // internal slot and host words

  // Signal pads and barriers (barrier.cpp).
  // Constructor steps: the pads and epochs in our internal slot, zeroed;
  // after the heap's sync, every rank's pads mapped here.
  void allocate_signal_pads();
  void map_signal_pads();
  void enqueue_barrier(cudaStream_t stream, BarrierKind kind) override;
  detail::StreamOpWatchdog& stream_op_watchdog();       // made on first use
  detail::PeerSignals peer_signals() const;             // every rank's pads and our patience, for the kernels
  detail::FailureWords failure_words() const override;  // how the kernels report a failure and learn of one
  // Barriers around a kernel unless the kernel meets its peers itself.
  // With `fused`, the kernel's first meeting is the call's first: it takes the call's digest.
  detail::BlockSync block_sync(bool fused) override;

  // all_gather and all_gather_staged: one call, numbered and in order (communicator.cpp).
  void all_gather_in_order(const void* in, void* out, std::size_t bytes_per_rank, cudaStream_t stream,
                           Algorithm algorithm, BarrierKind kind, const void* stage_from);

  // What the algorithms see of this call (detail::AlgorithmContext;
  // algorithm_context.cpp, barrier.cpp, scratch.cpp).
  void* peer_ptr(const void* ptr, int peer) const override;
  detail::CopyStreams& copy_streams() override;
  detail::StreamPipeline& pipeline() override;
  const detail::Tuning& tuning() const override { return tuning_; }
  detail::LowLatencyPackets low_latency_packets() const override;
  std::uint64_t* end_word() const override;
  std::uint64_t call_number() const override { return call_.number; }
  void ends_at_word() override { ends_.at_word = true; }

  // peer_memory.cpp
  void check_peer(int peer, const char* op) const;
  // peer_address's checks: a peer of the group, a range that went through rendezvous.
  void check_rendezvoused(const void* ptr, std::size_t bytes, int peer) const;
  // Enqueues a signal or wait on `stream`: `stream_ops` eagerly, `kernel`
  // under capture; a failure to enqueue fails the communicator (the counts
  // of the two ranks would no longer match).
  void point_to_point(const char* op, int peer, cudaStream_t stream, const std::function<void()>& stream_ops,
                      const std::function<cudaError_t()>& kernel);
  // At least `bytes` of plain device memory for the call in_order is enqueueing (scratch.cpp).
  void* scratch(std::size_t bytes) override;

  SymmetricHeap& heap_;
  CachingAllocator& allocator_;
  detail::Tuning tuning_;
  detail::MeetingWords words_;
  detail::StreamOpCounts stream_ops_;
  // Where copy-engine copies are issued, and the two-step algorithms' streams.
  std::unique_ptr<detail::EagerAndCaptured<detail::CopyStreams>> copies_;
  std::unique_ptr<detail::EagerAndCaptured<detail::StreamPipeline>> pipelines_;
  detail::CallEnds ends_;                      // before order_ and monitor_, which hold its end word
  std::unique_ptr<detail::IssueOrder> order_;  // collectives run in the order issued
  detail::CallState call_;
  std::unique_ptr<detail::StreamOpWatchdog> watchdog_;  // times out stream-op waits
  std::unique_ptr<detail::FailureMonitor> monitor_;
  detail::Scratch scratch_;
  detail::SymmetryVerdicts verdicts_;
  RendezvousRegistry rendezvoused_;  // ranges peers may be read at, while their allocation lives
};

}  // namespace symmpool
