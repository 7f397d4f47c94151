#include <symmpool/detail/deadline.hpp>
#include <symmpool/error.hpp>
#include <symmpool/log.hpp>
#include <symmpool/nccl_windows.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <sstream>
#include <thread>
#include <utility>

namespace symmpool {

namespace {

std::string describe(const SymmetricSegment& s) {
  return "the segment at offset " + std::to_string(s.offset) + " (" + std::to_string(s.size) + " bytes)";
}

// One line per rank's answer: "ok", "refused <why>" or "stuck <why>".
std::atomic<std::size_t> live_in_process{0};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

NcclWindows::NcclWindows(SymmetricHeap& heap, ncclComm_t comm, const NcclApi& nccl,
                         std::chrono::milliseconds timeout, UsableCheck usable)
    : heap_(heap), comm_(comm), nccl_(nccl), timeout_(timeout), usable_(std::move(usable)) {
  SYMMPOOL_EXPECTS(comm != nullptr, "NCCL windows need a communicator, got null");
  SYMMPOOL_EXPECTS(nccl.has_windows(), "the loaded NCCL (version code " + std::to_string(nccl.version) +
                                           ") has no ncclCommWindowRegister: NCCL 2.27 or newer has");
  try {
    heap_.set_symmetric_observer(this);
  } catch (...) {
    heap_.set_symmetric_observer(nullptr);  // the heap is broken: it must not call a half-made object
    deregister_all();
    throw;
  }
}

NcclWindows::~NcclWindows() {
  heap_.set_symmetric_observer(nullptr);
  deregister_all();
}

void NcclWindows::deregister_all() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!still_usable()) return;
  for (auto& [address, window] : windows_) deregister(window);
  windows_.clear();
}

bool NcclWindows::covers(const void* ptr, std::size_t bytes) const {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = windows_.upper_bound(address);
  if (it == windows_.begin()) return false;
  --it;
  return address - it->first <= it->second.size && bytes <= it->second.size - (address - it->first);
}

bool NcclWindows::empty() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return windows_.empty();
}

WindowCounts NcclWindows::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

std::string NcclWindows::last_refusal() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_refusal_;
}

std::size_t NcclWindows::abandon() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::size_t n = windows_.size();
  live_in_process.fetch_sub(n);
  abandoned_ = true;
  counts_.abandoned += n;
  windows_.clear();
  counts_.live = 0;
  counts_.live_bytes = 0;
  return n;
}

bool NcclWindows::still_usable() noexcept {
  if (abandoned_) return false;
  bool usable = true;
  try {
    usable = !usable_ || usable_();
  } catch (...) {
    usable = false;  // a check that cannot tell: leave the communicator alone
  }
  if (usable) return true;
  abandoned_ = true;
  live_in_process.fetch_sub(windows_.size());
  counts_.abandoned += windows_.size();
  windows_.clear();
  counts_.live = 0;
  counts_.live_bytes = 0;
  return false;
}

void NcclWindows::deregister(const Window& window) noexcept {
  const ncclResult_t r = nccl_.commWindowDeregister(comm_, window.handle);
  ++counts_.deregistrations;
  if (r != ncclSuccess) {
    ++counts_.failed_deregistrations;
    SYMMPOOL_WARN(kReg, "ncclCommWindowDeregister of the window at offset %zu failed: %s", window.offset,
                  nccl_.error_string(r));
  }
  --counts_.live;
  counts_.live_bytes -= window.size;
  live_in_process.fetch_sub(1);
}

std::size_t nccl_windows_in_process() { return live_in_process.load(); }

NcclWindows::Outcome NcclWindows::register_window(const SymmetricSegment& segment, ncclWindow_t* window,
                                                  std::string* why) {
  // Shared with the thread, which may outlive this call when NCCL's barrier
  // never ends (a peer left between the heap's exchange and NCCL's).
  struct Attempt {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    ncclResult_t result = ncclSuccess;
    ncclWindow_t window = nullptr;
  };
  auto attempt = std::make_shared<Attempt>();
  const auto start = std::chrono::steady_clock::now();
  std::thread([attempt, &nccl = nccl_, comm = comm_, segment] {
    ncclWindow_t made = nullptr;
    const ncclResult_t r =
        nccl.commWindowRegister(comm, segment.ptr, segment.size, &made, NCCL_WIN_COLL_SYMMETRIC);
    std::lock_guard<std::mutex> lock(attempt->mutex);
    attempt->result = r;
    attempt->window = made;
    attempt->done = true;
    attempt->done_cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(attempt->mutex);
  if (!attempt->done_cv.wait_until(lock, detail::deadline_after(timeout_), [&] { return attempt->done; })) {
    *why = "ncclCommWindowRegister of " + describe(segment) + " did not return within " +
           std::to_string(timeout_.count()) + " ms (a peer never reached NCCL's barrier)";
    return Outcome::kStuck;
  }
  const auto took = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  {
    std::lock_guard<std::mutex> counts_lock(mutex_);
    counts_.register_ns += took;
    counts_.longest_register_ns = std::max(counts_.longest_register_ns, took);
  }
  if (attempt->result != ncclSuccess) {
    *why = std::string("ncclCommWindowRegister: ") + nccl_.error_string(attempt->result);
    return Outcome::kRefused;
  }
  if (attempt->window == nullptr) {
    *why =
        "ncclCommWindowRegister made no window (windows are off in this NCCL: NCCL_WIN_ENABLE, "
        "NCCL_CUMEM_ENABLE?)";
    return Outcome::kRefused;
  }
  *window = attempt->window;
  return Outcome::kRegistered;
}

void NcclWindows::on_symmetric_segments(const std::vector<SymmetricSegment>& now) {
  std::vector<SymmetricSegment> fresh;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!still_usable()) return;  // an aborted group: its peers fail too
    // Windows no longer symmetric go first, in address order on every rank.
    for (auto it = windows_.begin(); it != windows_.end();) {
      const bool stays = std::any_of(now.begin(), now.end(), [&](const SymmetricSegment& s) {
        return reinterpret_cast<std::uintptr_t>(s.ptr) == it->first && s.size == it->second.size;
      });
      if (stays) {
        ++it;
        continue;
      }
      deregister(it->second);
      it = windows_.erase(it);
    }
    for (const SymmetricSegment& s : now)
      if (!windows_.count(reinterpret_cast<std::uintptr_t>(s.ptr))) fresh.push_back(s);
  }
  if (fresh.empty()) return;  // the same on every rank: no exchange needed

  // Each rank registers the new ones in offset order, then every rank hears
  // how each went: a window stays only where every rank has it.
  std::vector<ncclWindow_t> made(fresh.size(), nullptr);
  std::string mine;
  bool stuck = false;
  for (std::size_t i = 0; i < fresh.size() && !stuck; ++i) {
    std::string why;
    const Outcome outcome = register_window(fresh[i], &made[i], &why);
    stuck = outcome == Outcome::kStuck;
    mine += outcome == Outcome::kRegistered ? "ok\n" : (stuck ? "stuck " : "refused ") + why + "\n";
  }
  const std::vector<std::string> all =
      heap_.exchange_among_ranks("nccl windows for " + std::to_string(fresh.size()) + " segments", mine);

  std::lock_guard<std::mutex> lock(mutex_);
  std::string stuck_report;
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    std::string refusal;
    bool everywhere = true;
    for (std::size_t r = 0; r < all.size(); ++r) {
      const std::vector<std::string> lines = lines_of(all[r]);
      const std::string line = i < lines.size() ? lines[i] : "stuck before it";
      if (line == "ok") continue;
      everywhere = false;
      if (line.rfind("stuck", 0) == 0 || i >= lines.size())
        stuck_report += "; rank " + std::to_string(r) + ": " + line;
      else if (refusal.empty())
        refusal = "rank " + std::to_string(r) + ": " + line.substr(line.find(' ') + 1);
    }
    const auto address = reinterpret_cast<std::uintptr_t>(fresh[i].ptr);
    if (everywhere && !abandoned_) {
      windows_[address] = Window{made[i], fresh[i].offset, fresh[i].size};
      live_in_process.fetch_add(1);
      ++counts_.registrations;
      ++counts_.live;
      counts_.live_bytes += fresh[i].size;
      continue;
    }
    if (made[i] != nullptr) {  // this rank has one its peers lack: it goes
      live_in_process.fetch_add(1);
      ++counts_.live;
      counts_.live_bytes += fresh[i].size;
      if (!abandoned_) deregister(Window{made[i], fresh[i].offset, fresh[i].size});
    }
    if (!refusal.empty()) {
      ++counts_.refusals;
      last_refusal_ = "NCCL refused a symmetric window over " + describe(fresh[i]) + " (" + refusal +
                      "); the segment stays registered locally";
      SYMMPOOL_WARN(kReg, "%s", last_refusal_.c_str());
    }
  }
  if (!stuck_report.empty())
    throw timeout_error("symmpool: NCCL window registration did not complete on every rank" + stuck_report);
}

void NcclWindows::on_segments_releasing() { deregister_all(); }

}  // namespace symmpool
