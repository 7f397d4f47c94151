#pragma once
// What a collective algorithm sees of its communicator during one call: the
// ranks, peers' copies of symmetric buffers, the symmetry checks, meetings,
// launch settings, copy lanes and scratch. Algorithms are free functions
// over it (collectives/src/algorithms.hpp), one file each; the Communicator
// is the only implementation. Adding an algorithm adds its file and its
// entry where the call picks one, not a member of the core.

#include <symmpool/collective_types.hpp>
#include <symmpool/detail/communicator_parts.hpp>
#include <symmpool/detail/peer_pointers.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace symmpool::detail {

class CopyStreams;
class StreamPipeline;

// Where the low-latency all-reduce's packets go.
struct LowLatencyPackets {
  OutPointers regions{};           // every rank's packet regions, as mapped here
  std::size_t slot_packets = 0;    // packets per sender and parity
  std::uint32_t* epoch = nullptr;  // this rank's epoch words, device-side
};

class AlgorithmContext {
 public:
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // Where `peer`'s copy of a symmetric buffer is mapped here (ours: `ptr`).
  virtual void* peer_ptr(const void* ptr, int peer) const = 0;
  // One exchange per buffer not seen before, tagged with the call: the same
  // verdict on every rank. require_symmetric throws not_symmetric_error.
  virtual void require_symmetric(const void* ptr, std::size_t bytes, const char* what) = 0;
  virtual bool is_symmetric(const void* ptr, std::size_t bytes, const char* what) = 0;
  // A meeting of every rank on `stream` (kernel or stream memory operations).
  virtual void enqueue_barrier(cudaStream_t stream, BarrierKind kind) = 0;
  // How a kernel meets its peers: with `fused` its first meeting is the call's first.
  virtual BlockSync block_sync(bool fused) = 0;
  // At least `bytes` of plain device memory for this call.
  virtual void* scratch(std::size_t bytes) = 0;
  // Whether this call goes into a CUDA graph capture.
  virtual bool capturing() const = 0;
  // The copy-engine lanes and the two-step pipeline for this call (eager or captured).
  virtual CopyStreams& copy_streams() = 0;
  virtual StreamPipeline& pipeline() = 0;
  virtual const Tuning& tuning() const = 0;
  virtual LowLatencyPackets low_latency_packets() const = 0;
  virtual FailureWords failure_words() const = 0;
  // An eager call whose kernel is its last work may end at the call end
  // word: the word (null under capture or where the device has none) and
  // the number the kernel writes there; ends_at_word() tells the core it did.
  virtual std::uint64_t* end_word() const = 0;
  virtual std::uint64_t call_number() const = 0;
  virtual void ends_at_word() = 0;

 protected:
  ~AlgorithmContext() = default;
};

}  // namespace symmpool::detail
