#pragma once
// A Communicator's state, grouped by what each part serves: the words its
// kernels and stream operations meet on, the settings it was given, the
// counts of its eager stream-op meetings, where its calls end, the call
// under way, its scratch memory and its symmetry verdicts.

#include <symmpool/collective_types.hpp>
#include <symmpool/detail/peer_pointers.hpp>
#include <symmpool/detail/shared_event.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace symmpool::detail {

class CallCheck;
class CallEndWord;
class EventPool;
struct ErrorWords;

// In our internal heap slot (symmetric, device-side) unless said otherwise.
struct MeetingWords {
  void* internal = nullptr;                    // the slot itself
  std::uint32_t* pads = nullptr;               // [kPadRows][kMaxRanks]
  std::uint32_t* kernel_epoch = nullptr;       // counter of kernel barriers
  std::uint32_t* block_epochs = nullptr;       // counters of block meetings
  std::uint32_t* signals_sent = nullptr;       // one per peer: signal()s
  std::uint32_t* signals_received = nullptr;   // one per peer: wait()s passed
  std::uint32_t* low_latency_epoch = nullptr;  // the last low-latency call's epoch, blocks done
  std::uint32_t* failed_word = nullptr;        // nonzero once a kernel saw this communicator fail
  void* packets = nullptr;                     // our low-latency packet regions
  OutPointers packet_regions{};                // every rank's, mapped here
  PadPointers peer_pads{};                     // every rank's pads, mapped here
  ErrorWords* error_words = nullptr;           // host-mapped: set by a barrier that timed out
  int* error_flag = nullptr;                   // the same words, as the kernels take them
};

// What the communicator was given (CollectiveOptions, the timeout argument).
struct Tuning {
  std::size_t low_latency_max_bytes = 0;
  std::optional<Algorithm> all_reduce_preference;      // SYMMPOOL_ALL_REDUCE_ALGORITHM
  std::optional<Algorithm> reduce_scatter_preference;  // SYMMPOOL_REDUCE_SCATTER_ALGORITHM
  int two_step_piece_bytes = 0;                        // SYMMPOOL_TWO_STEP_PIECE_BYTES
  int timeout_seconds = 0;                             // barriers' patience
  long long timeout_cycles = 0;                        // the same in clock cycles, for the kernels
  int max_blocks = 0;                                  // grid cap of unsynchronised reductions
  std::size_t fused_max_bytes = 0;  // reductions reading up to this from each peer meet inside
};

// Host-side counts of the stream-memory-op meetings, equal on every rank.
struct StreamOpCounts {
  std::uint32_t epoch = 0;                          // barriers
  std::uint32_t checked_epoch = 0;                  // ... and checked (first) meetings
  std::array<std::uint32_t, kMaxRanks> sent{};      // per peer: eager signal()s
  std::array<std::uint32_t, kMaxRanks> received{};  // per peer: eager wait()s
};

// Where calls end: an event each, or a word the kernel writes.
struct CallEnds {
  std::shared_ptr<EventPool> events;  // one event per call, shared
  SharedEvent last;                   // the last call's, until the caller takes it
  // Where eager calls whose kernel reports its own end end (null: the
  // device takes no 64-bit stream memops, and every call records an event).
  std::unique_ptr<CallEndWord> word;
  bool at_word = false;  // set by the current call's enqueue
  // The last call's stream, where it ended at the word (the legacy default
  // stream is a null handle: empty means none).
  std::optional<cudaStream_t> word_ended_stream;
};

// The collective being issued, and how many were.
struct CallState {
  unsigned long long capture = 0;  // the capture in_order's enqueue goes into (0: eager)
  std::uint64_t number = 0;        // collectives asked of us or run elsewhere, same on every rank
  const char* op = "";             // the current call's op; with number, what symmetry exchanges carry
  // The current call's digest (number, op, symmetric buffers' offsets), for its first meeting.
  std::unique_ptr<CallCheck> check;
  bool exchange_next_check = false;  // a call ran elsewhere: the next call here verifies alignment
};

// Plain device memory for staging.
struct Scratch {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  bool captured = false;       // ptr is in a captured CUDA graph
  std::vector<void*> retired;  // outgrown but in graphs: freed with the communicator
};

// Buffers seen symmetric (empty) or not (why not), until the next sync or local unmap.
struct SymmetryVerdicts {
  std::map<std::pair<const void*, std::size_t>, std::string> checked;
  std::uint64_t releases_at = 0;  // the heap's releases() when `checked` was last valid
};

}  // namespace symmpool::detail
