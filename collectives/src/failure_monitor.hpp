#pragma once
// Makes a communicator's failures loud and sticky, the way ProcessGroupNCCL's
// watchdog and flight recorder do for NCCL:
// - a flight record of the collectives issued (sequence number, operation,
//   bytes) and each one's end (a CUDA event, or for an eager low-latency
//   all-reduce the call number its kernel writes last: CallEndWord), so a
//   failure names the collective that never finished;
// - a thread that notices when a barrier gave up on a peer (the kernels and
//   the stream-op watchdog write the missing rank into the error words),
//   records the error once for good and calls the owner's handler (the torch
//   backend aborts the process there, as TORCH_NCCL_ASYNC_ERROR_HANDLING
//   asks) before it lets the stalled kernel go on. So no stream gets past a
//   failed collective before the failure is on record.

#include "call_end_word.hpp"
#include "error_words.hpp"

#include <symmpool/detail/failure_record.hpp>
#include <symmpool/detail/shared_event.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace symmpool::detail {

class FailureMonitor {
 public:
  using Handler = std::function<void(const std::string&)>;

  // `words`: host-mapped ErrorWords the kernels write; `handler` is called
  // once, from the monitor's thread or the caller's, with the error text;
  // `end_word`: where calls that report their own end end (may be null),
  // outlives us.
  FailureMonitor(int device, int rank, int world, std::chrono::seconds timeout, ErrorWords* words,
                 Handler handler, const CallEndWord* end_word = nullptr);
  ~FailureMonitor();
  FailureMonitor(const FailureMonitor&) = delete;
  FailureMonitor& operator=(const FailureMonitor&) = delete;

  // After collective `op` of `bytes` was enqueued (eager: it ends at `done`)
  // or captured into a graph (`done` is ignored: replays are not tracked).
  void record(const char* op, std::size_t bytes, SharedEvent done, bool captured);
  // The same for an eager collective that ends when the end word reaches
  // `call` (the communicator's number for it).
  void record_ending_at_word(const char* op, std::size_t bytes, std::uint64_t call);
  // The same for a point-to-point `op` ("signal" or "wait") with `peer`.
  // Numbered per op and peer, apart from the collectives: ranks signal and
  // wait different numbers of times, and the collectives' numbers must stay
  // the same on every rank to be compared.
  void record_point_to_point(const char* op, int peer, SharedEvent done, bool captured);

  // Fails the communicator: `missing_rank` never arrived (kernels, stream-op
  // watchdog), or `reason` says what broke on the host. Idempotent.
  void fail_missing(int missing_rank);
  void fail(const std::string& reason);
  // A kernel found that `rank`'s call differs from ours (its digest), or
  // that `rank` had failed.
  void fail_differing(int rank, bool peer_had_failed = false);

  // Handles a failure the kernels reported but the thread did not see yet.
  void poll();

  const std::shared_ptr<FailureRecord>& record_of_failure() const { return failure_; }
  std::uint64_t issued() const;
  // The oldest eager call the GPU has not finished, as a failure names it.
  std::string describe_unfinished();
  // cudaEventQuery calls made to retire finished calls (a test's measure of
  // their host cost, which shows in an eager call's: bench/peers/README.md).
  std::uint64_t event_queries() const;
  // Tests: finished calls are retired on the caller's thread only (every
  // 1024 records), so that the queries they count do not depend on when
  // the monitor's thread polls.
  void retire_on_callers_thread_only_for_testing() { thread_retires_ = false; }

 private:
  struct Entry {
    std::uint64_t seq;  // of the collectives, or of `op` with `peer`
    const char* op;
    std::size_t bytes;
    int peer;                        // -1 for collectives
    SharedEvent done;                // its end, or
    std::uint64_t ends_at_call = 0;  // nonzero: it ended once the end word reached this
  };
  void push(Entry entry, bool captured);  // under mutex_
  void watch();
  // Under mutex_. Entries retired go to `retired` where given (to be let
  // go after the lock: each gives its event back to the pool).
  void retire_finished(std::vector<Entry>* retired = nullptr);
  void retire_on_this_thread();       // the monitor's, at every poll
  bool finished(const Entry& entry);  // under mutex_
  void finish_failure(const std::string& message);

  const int device_, rank_, world_;
  const std::chrono::seconds timeout_;
  ErrorWords* const words_;
  const CallEndWord* const end_word_;
  const Handler handler_;
  std::shared_ptr<FailureRecord> failure_ = std::make_shared<FailureRecord>();

  mutable std::mutex mutex_;  // entries_, next_seq_
  std::deque<Entry> entries_;
  std::atomic<bool> thread_retires_{true};
  std::size_t retire_at_ = 0;  // entries_ size at which record retires finished ones next
  std::uint64_t event_queries_ = 0;
  std::uint64_t next_seq_ = 1;
  std::map<std::pair<std::string, int>, std::uint64_t> point_to_point_calls_;  // (op, peer) -> calls so far

  std::mutex handling_;  // one failure handled at a time, per communicator
  std::mutex stop_mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace symmpool::detail
