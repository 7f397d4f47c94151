#include "failure_monitor.hpp"

#include "relaxed_capture.hpp"

#include <symmpool/detail/scope_exit.hpp>
#include <symmpool/error.hpp>
#include <symmpool/log.hpp>

#include <cstdio>
#include <vector>

namespace symmpool::detail {

namespace {

// How often the thread looks at the error words: a failure is on record
// (and the process aborted, where asked) this long after a barrier gave up.
constexpr std::chrono::milliseconds kPollInterval{20};

// Collectives remembered while in flight; older entries are dropped once
// this many are outstanding (the GPU is far behind the host).
constexpr std::size_t kMaxEntries = 4096;

// Finished entries are retired (their events queried and let go) by the
// monitor's thread at every poll. The caller's thread retires only once
// this many more are in flight than after the last retiring, as
// backpressure when the host issues faster than the thread polls: a retire
// on the caller's thread even every 32 calls still showed in an eager small
// all-reduce's host time (py-spy; a query on each call, much more).
// Counted from the last retiring, not from zero: with the GPU more than a
// batch behind the host, a fixed threshold stayed crossed and every record
// queried again (py-spy showed it in an eager all-reduce's host time).
constexpr std::size_t kRetireBatch = 1024;

int volatile_read(const int& word) { return *static_cast<const volatile int*>(&word); }
void volatile_write(int& word, int value) { *static_cast<volatile int*>(&word) = value; }

}  // namespace

std::string FailureRecord::message() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return message_;
}

bool FailureRecord::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !message_.empty();
}

bool FailureRecord::set(const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!message_.empty()) return false;
  message_ = message;
  return true;
}

FailureMonitor::FailureMonitor(int device, int rank, int world, std::chrono::seconds timeout,
                               ErrorWords* words, Handler handler, const CallEndWord* end_word)
    : device_(device),
      rank_(rank),
      world_(world),
      timeout_(timeout),
      words_(words),
      end_word_(end_word),
      handler_(std::move(handler)) {
  thread_ = std::thread([this] { watch(); });
}

FailureMonitor::~FailureMonitor() {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void FailureMonitor::record(const char* op, std::size_t bytes, SharedEvent done, bool captured) {
  std::lock_guard<std::mutex> lock(mutex_);
  push({next_seq_++, op, bytes, -1, std::move(done)}, captured);
}

void FailureMonitor::record_ending_at_word(const char* op, std::size_t bytes, std::uint64_t call) {
  std::lock_guard<std::mutex> lock(mutex_);
  push({next_seq_++, op, bytes, -1, {}, call}, false);
}

void FailureMonitor::record_point_to_point(const char* op, int peer, SharedEvent done, bool captured) {
  std::lock_guard<std::mutex> lock(mutex_);
  push({++point_to_point_calls_[{op, peer}], op, 0, peer, std::move(done)}, captured);
}

void FailureMonitor::push(Entry entry, bool captured) {
  if (captured) return;  // graph replays are not tracked; the sequence still counts
  if (entries_.size() >= retire_at_) {
    retire_finished();
    retire_at_ = entries_.size() + kRetireBatch;
  }
  if (entries_.size() >= kMaxEntries) entries_.pop_front();
  entries_.push_back(std::move(entry));
}

std::uint64_t FailureMonitor::issued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_seq_ - 1;
}

std::uint64_t FailureMonitor::event_queries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return event_queries_;
}

bool FailureMonitor::finished(const Entry& entry) {
  if (entry.ends_at_call != 0) return end_word_->reached(entry.ends_at_call);
  ++event_queries_;
  return cudaEventQuery(entry.done.get()) == cudaSuccess;
}

// Eager collectives end in the order they were issued (each one's stream
// waits for the previous one's end: IssueOrder), so the newest finished one
// vouches for every older one. The newest first (the GPU keeping up), then
// the oldest (the GPU behind them all): one or two queries in the common
// cases instead of one per call (a query per call was a large share of an
// eager small all-reduce's host time: bench/peers/README.md,
// bench/results/host_time_h200x2_2026-11-27_monitor-retire-ab.json); in between, probes
// back from the newest (2, 4, ... calls back) and a bisection. Point-to-
// point calls are outside that order and are queried one by one.
void FailureMonitor::retire_finished(std::vector<Entry>* retired) {
  // The caller's thread may be capturing in global mode (torch.cuda.graph),
  // which refuses cudaEventQuery and would invalidate the capture.
  RelaxedCaptureMode relaxed;
  std::vector<std::size_t> collectives;  // positions in entries_
  for (std::size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].peer < 0 && (entries_[i].done || entries_[i].ends_at_call != 0)) collectives.push_back(i);
  const std::size_t n = collectives.size();
  auto finished_at = [&](std::size_t k) { return finished(entries_[collectives[k]]); };
  std::size_t done = 0, not_done = n;  // collectives [0, done) finished, [not_done, n) not
  if (n > 0 && finished_at(n - 1)) {
    done = n;
  } else if (n > 1 && finished_at(0)) {
    done = 1;
    not_done = n - 1;
    for (std::size_t back = 2; back < n && n - back >= done; back *= 2) {
      if (finished_at(n - back)) {
        done = n - back + 1;
        break;
      }
      not_done = n - back;
    }
  } else {
    not_done = 0;
  }
  while (done < not_done) {
    const std::size_t mid = done + (not_done - done) / 2;
    if (finished_at(mid))
      done = mid + 1;
    else
      not_done = mid;
  }
  const std::size_t last_done = done > 0 ? collectives[done - 1] : 0;
  for (std::size_t position = 0; !entries_.empty(); ++position) {
    const Entry& e = entries_.front();
    const bool ended = e.peer < 0 ? done > 0 && position <= last_done : e.done && finished(e);
    if (!ended) break;
    if (retired) retired->push_back(std::move(entries_.front()));
    entries_.pop_front();  // its event goes back to the pool once no Work holds it either
  }
  (void)cudaGetLastError();  // cudaErrorNotReady is not an error to keep
}

void FailureMonitor::retire_on_this_thread() {
  if (!thread_retires_) return;
  std::vector<Entry> retired;  // let go after the lock: record() waits on it meanwhile
  std::lock_guard<std::mutex> lock(mutex_);
  if (entries_.empty()) return;  // no CUDA call while nothing is in flight
  retire_finished(&retired);
  retire_at_ = entries_.size() + kRetireBatch;
}

// The oldest collective whose end the GPU has not reached: the one stuck on
// the barrier that gave up (kernels wait for the acknowledgement).
std::string FailureMonitor::describe_unfinished() {
  std::lock_guard<std::mutex> lock(mutex_);
  retire_finished();
  if (entries_.empty())
    return "a collective (none issued eagerly is unfinished: a CUDA graph replay?) after #" +
           std::to_string(next_seq_ - 1);
  const Entry& e = entries_.front();
  const std::string collectives = std::to_string(next_seq_ - 1) + " collectives issued";
  if (e.peer >= 0)
    return std::string(e.op) + " #" + std::to_string(e.seq) +
           (std::string(e.op) == "wait" ? " from" : " to") + " rank " + std::to_string(e.peer) + " (" +
           collectives + ")";
  return std::string(e.op) + " #" + std::to_string(e.seq) + " (" + std::to_string(e.bytes) + " bytes; " +
         collectives + ")";
}

void FailureMonitor::fail_missing(int missing_rank) {
  if (volatile_read(words_->missing) == 0) volatile_write(words_->missing, missing_rank + 1);
  finish_failure("symmpool: " + describe_unfinished() + " on rank " + std::to_string(rank_) + " of " +
                 std::to_string(world_) + " failed: rank " + std::to_string(missing_rank) +
                 " did not arrive within " + std::to_string(timeout_.count()) +
                 " s (peer dead, or the ranks' collectives differ); the communicator is unusable");
}

void FailureMonitor::fail_differing(int rank, bool peer_had_failed) {
  const std::string why =
      peer_had_failed ? " had failed before (its communicator is unusable: see its error)"
                      : " is at another call, or passed symmetric buffers at other offsets of the heap "
                        "(ranks that allocate differently place tensors differently)";
  finish_failure("symmpool: " + describe_unfinished() + " on rank " + std::to_string(rank_) + " of " +
                 std::to_string(world_) + " failed: rank " + std::to_string(rank) + why +
                 "; the communicator is unusable");
}

void FailureMonitor::fail(const std::string& reason) {
  if (volatile_read(words_->missing) == 0) volatile_write(words_->missing, kFailedOnHost);  // kernels drain
  finish_failure("symmpool: communicator of rank " + std::to_string(rank_) + " of " + std::to_string(world_) +
                 " failed after " + std::to_string(issued()) + " collectives: " + reason +
                 "; the communicator is unusable");
}

void FailureMonitor::finish_failure(const std::string& message) {
  std::lock_guard<std::mutex> lock(handling_);  // the first failure's handler runs before anyone acknowledges
  // Acknowledged even where the handler throws: every kernel that finds the
  // failed word holds until then, and would each wait out its timeout.
  const ScopeExit acknowledge([this] { volatile_write(words_->acknowledged, 1); });
  if (failure_->set(message) && handler_) handler_(message);
}

void FailureMonitor::poll() {
  if (failure_->failed()) return;
  const int differing = volatile_read(words_->differing);  // written before `missing`
  const int missing = volatile_read(words_->missing);
  if (missing == kCallsDiffer && differing > 0)
    fail_differing((differing & (kPeerHadFailed - 1)) - 1, (differing & kPeerHadFailed) != 0);
  else if (missing > 0)
    fail_missing(missing - 1);
}

void FailureMonitor::watch() {
  cudaSetDevice(device_);  // events are queried on the communicator's device
  std::unique_lock<std::mutex> lock(stop_mutex_);
  while (!wake_.wait_for(lock, kPollInterval, [this] { return stop_; })) {
    lock.unlock();
    try {
      poll();
      retire_on_this_thread();
    } catch (const std::exception& e) {
      SYMMPOOL_WARN(kColl, "failure monitor: %s", e.what());
    }
    lock.lock();
  }
}

}  // namespace symmpool::detail
