#pragma once
// Gives the stream-memop waits the timeout the kernels' waits have.
// cuStreamWaitValue32 waits forever, so a dead peer would hang the stream
// (and cudaDeviceSynchronize, and the process's exit). This thread watches
// the waits by channel: the stream-op barriers (every rank's slot of our
// barrier row), the checked first meetings (every rank's pair of 64-bit
// words) and, per peer, the waits for that peer's signals (its slot of
// our signal row). The stream notes on the host when it reaches a channel's
// waits and when they pass. A channel whose stream has sat in its waits for
// `timeout` (timed from when the GPU got there, as a kernel's wait is, not
// from when the host enqueued them: a stream blocked elsewhere blames no
// one here) records each rank whose slot is behind through `on_timeout` (the
// communicator's failure monitor: the error goes on record first), then
// writes the awaited value into that slot so the stream goes on. Once the
// communicator failed for any reason, waits not passed go at once.

#include "stream_op_batch.hpp"

#include <symmpool/detail/peer_pointers.hpp>
#include <symmpool/driver_api.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace symmpool::detail {

// One channel's progress as the watchdog saw it at its last tick.
struct ChannelClock {
  std::uint32_t last_reached = 0, last_passed = 0;
  std::chrono::steady_clock::time_point since{};
};

enum class ChannelVerdict {
  kWaiting,   // idle, moving, or its stream is elsewhere (not in its waits)
  kTimedOut,  // its stream sat in a wait for the timeout: blame who is behind
  kRelease,   // the communicator failed: let every wait issued pass (every tick while any remain)
};

// A rank's pair of a checked meeting (stream_op_batch.hpp) as our slots hold
// it when our wait for `epoch` timed out, our digest being `digest`.
enum class PairVerdict {
  kArrived,        // its values pass our waits
  kMissing,        // it has not reached the meeting
  kAtAnotherCall,  // it reached it with another digest: another call, or other buffers
};
PairVerdict judge_pair(std::uint64_t low, std::uint64_t high, std::uint32_t epoch, std::uint32_t digest);

// One tick's decision for a channel whose last wait awaits `issued`, whose
// stream last reached the waits for `reached` and passed those for
// `passed`; updates `clock`. Pure, so it is tested without a GPU.
ChannelVerdict judge_channel(ChannelClock& clock, std::uint32_t issued, std::uint32_t reached,
                             std::uint32_t passed, bool failed, std::chrono::steady_clock::time_point now,
                             std::chrono::seconds timeout);

class StreamOpWatchdog {
 public:
  // `barrier_row` and `signal_row`: our pad rows (device memory) the
  // barriers' and the signals' waits read, one slot per rank;
  // `error_flag`: host-mapped, nonzero once the communicator failed;
  // `failed_word`: the kernels' (device memory), set before any wait is
  // released (the communicator has failed), so later kernels leave peers alone.
  // `checked_pairs`: our 64-bit slots of the checked meetings, a pair per
  // rank; `on_differing(rank)` records a rank found at another call there.
  StreamOpWatchdog(const DriverApi& drv, int device, int rank, std::uint32_t* barrier_row,
                   std::uint32_t* signal_row, std::uint64_t* checked_pairs, int world, const int* error_flag,
                   std::uint32_t* failed_word, std::chrono::seconds timeout,
                   std::function<void(int)> on_timeout, std::function<void(int)> on_differing);
  ~StreamOpWatchdog();
  StreamOpWatchdog(const StreamOpWatchdog&) = delete;
  StreamOpWatchdog& operator=(const StreamOpWatchdog&) = delete;

  static constexpr int kBarrierChannel = 0;
  static constexpr int signal_channel(int peer) { return 1 + peer; }
  static constexpr int kCheckedChannel = 1 + kMaxRanks;  // the checked meetings, by their own epochs

  // Whether the device takes 64-bit stream memops, which checked meetings
  // need (a call's first meeting is a kernel where it does not).
  bool checks_calls() const { return checks_calls_; }

  // Notes that waits of `channel` for `value` (a barrier's epoch, or a
  // count of the peer's signals) are about to be enqueued, before any of
  // them is; returns where the stream notes reaching and passing them
  // (add_barrier, add_watched_wait). Values on one channel are issued in
  // increasing order, and its waits pass in that order.
  WatchNotes issue(int channel, std::uint32_t value);

 private:
  using Clock = std::chrono::steady_clock;
  struct Channel {
    std::uint32_t* slots = nullptr;  // device memory: the words its waits read
    std::uint64_t* pairs = nullptr;  // or, for the checked meetings, a pair of words per rank
    int first_rank = 0;              // whose word slots[0] is
    int count = 0;
    std::atomic<std::uint32_t> issued{0};  // the value the last wait enqueued awaits
    ChannelClock clock;                    // the thread's own
  };
  static constexpr int kChannels = 2 + kMaxRanks;
  // Host-mapped words: reached and passed per channel, then the slots of
  // one channel as last read (at most one per rank).
  static constexpr int kWords = 2 * kChannels + kMaxRanks;
  static_assert(kWords % 2 == 0, "the checked pairs' room after the words is 8-byte aligned");
  static constexpr std::size_t kPinnedBytes =
      kWords * sizeof(std::uint32_t) + 2 * kMaxRanks * sizeof(std::uint64_t);

  void watch();
  void check(Channel& channel, int index, bool failed, cudaStream_t side);
  // Writes the last value issued into each slot of `channel` still below
  // `below` (blaming its rank first, when `blame`), so the waits pass.
  void release(Channel& channel, std::uint32_t below, bool blame, cudaStream_t side);
  // The same for the checked meetings: lets every wait issued pass, and
  // where `blame`, records each rank that stalls the meeting at `epoch` as
  // missing or at another call.
  void release_pairs(Channel& channel, std::uint32_t epoch, bool blame, cudaStream_t side);
  CUdeviceptr on_device(const std::uint32_t* word) const;

  const DriverApi& drv_;
  const int device_;
  const int* const error_flag_;
  std::uint32_t* const failed_word_;
  const int rank_;
  const std::chrono::seconds timeout_;
  const std::function<void(int)> on_timeout_;
  const std::function<void(int)> on_differing_;
  std::array<Channel, kChannels> channels_;
  bool checks_calls_ = false;
  // Host-mapped, per channel: the last value whose waits the GPU reached,
  // and the last that passed; then pinned room for a channel's slots.
  std::uint32_t* words_ = nullptr;
  std::uint32_t* reached_ = nullptr;
  std::uint32_t* passed_ = nullptr;
  std::uint32_t* seen_ = nullptr;
  std::uint64_t* seen_pairs_ = nullptr;       // pinned: the checked pairs as last read
  std::uint32_t* words_on_device_ = nullptr;  // words_, as the device sees it
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::promise<void> started_;  // set once by the thread: running, or why it is not
  std::thread thread_;
};

}  // namespace symmpool::detail
