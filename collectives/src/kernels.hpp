#pragma once
// Launchers of the collectives' device code (barrier_kernels.cu,
// reduce_kernel.cu, gather_kernel.cu, low_latency_kernel.cu). Kernels given an
// enabled BlockSync meet their peers block by block at their start (inputs
// ready everywhere) and at their end (nobody reads or writes a peer any
// more); otherwise the caller brackets them with launch_barrier.

#include <symmpool/collective_types.hpp>
#include <symmpool/detail/peer_pointers.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace symmpool::detail {

// Signals every peer, then waits until every peer signalled this epoch; a
// wait longer than the timeout sets signals.failure's error flag to 1 + the
// missing rank.
cudaError_t launch_barrier(const PeerSignals& signals, int world, std::uint32_t* epoch_counter,
                           cudaStream_t stream);

// Point-to-point signals, counted on the device (so graphs replay them
// right): signal adds one to what `peer` sees from us on kSignalRow (a
// release: what the stream did before is visible to the peer); wait holds
// the stream until `peer`'s count reaches one more than what this rank
// consumed before (an acquire), then consumes it. `sent`/`received`: this
// rank's counters, one word per peer. A wait that gives up sets the error
// flag as a barrier does.
cudaError_t launch_signal(const PeerSignals& signals, int peer, std::uint32_t* sent, cudaStream_t stream);
cudaError_t launch_wait(const PeerSignals& signals, int peer, std::uint32_t* received, cudaStream_t stream);

// One reduction kernel: for i < count and o < n_outs,
//   out_o[dst_offset + i] = scale * sum_p in_p[src_offset + i], in fp32
// (offsets and counts in elements of `type`).
struct ReduceLaunch {
  BlockSync sync;     // enabled: the kernel meets its peers itself
  PeerPointers in{};  // `world` inputs
  std::size_t src_offset = 0;
  OutPointers out{};  // `n_outs` outputs
  int n_outs = 1;
  std::size_t dst_offset = 0;
  std::size_t count = 0;
  // Sizes the grid: with sync enabled it must be equal on every rank, so
  // two-shot passes its full chunk even where the last one is short.
  std::size_t grid_count = 0;
  int world = 0;
  DataType type = DataType::kFloat32;
  float scale = 1.0f;
  int max_blocks = 0;  // the grid's cap; with sync, equal on every rank and <= kMaxSyncBlocks
};
cudaError_t launch_reduce(const ReduceLaunch& launch, cudaStream_t stream);

// Low-latency all-reduce (low_latency_kernel.cu), NCCL's LL protocol: each
// rank writes its input into every peer's packet region as 16-byte packets
// {data, flag, data, flag} whose flag is the call's epoch, then sums, in
// rank order, its own input with the packets it finds carrying that epoch.
// Each 8-byte half {data, flag} of a volatile 16-byte store is taken to land
// whole (PTX does not promise it; NCCL's LL protocol relies on it over
// NVLink, PCIe and cuMem mappings alike), so data arrives with its flag: no
// barrier, no fence. Two regions alternate by epoch: a rank writes epoch e
// only after it has read every peer's packets of e - 1, which they sent
// after finishing e - 2, the last reader of that region. That needs the
// communicator's calls to run one at a time on the GPU (IssueOrder; a graph
// replayed beside eager calls of the same communicator is the caller's to
// order, as for every collective). A rank's last packet carries ~epoch as its
// second flag: ranks whose calls have different sizes (in 8-byte units) each
// wait for a packet that never comes and time out, instead of the smaller
// one summing the first part of the larger one's input. (~epoch never
// matches a stale packet: it has the other parity, which lives in the other
// region.)
constexpr std::size_t kPacketBytes = 16;  // carries 8 bytes of data
struct LowLatencyLaunch {
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;  // elements of `type`
  DataType type = DataType::kFloat32;
  float scale = 1.0f;
  int world = 0;
  int rank = 0;
  // Every rank's packet regions as mapped here: [2 parities][world senders][slot_packets].
  OutPointers regions{};
  std::size_t slot_packets = 0;
  // This rank's, device-side: [0] the last call's epoch, [1] blocks done with this call.
  std::uint32_t* epoch = nullptr;
  FailureWords failure;  // as PeerSignals': error_flag set to 1 + a rank whose packets never came
  // Eager calls: the last block writes `call` here as the kernel's last act
  // (CallEndWord); null in captures and where the call ends elsewhere.
  std::uint64_t* end_word = nullptr;
  std::uint64_t call = 0;
};
// Throws symmpool::cuda_error where the launch fails.
void launch_low_latency_all_reduce(const LowLatencyLaunch& launch, cudaStream_t stream);

// What a gather kernel copies into this rank's own input before it meets
// the peers (null `from`: nothing).
struct Staging {
  const char* from = nullptr;
  char* to = nullptr;  // src.ptr[rank]
};

// dst[p * bytes, (p + 1) * bytes) = src_p[0, bytes) for every p < world;
// src_rank filled from `staging.from` first where given.
cudaError_t launch_gather_copy(const BlockSync& sync, const PeerPointers& src, char* dst, std::size_t bytes,
                               int world, cudaStream_t stream, Staging staging = {});

// CUDA loads a kernel at its first launch by default (lazy loading), and
// that load may wait for the whole context: behind a barrier kernel that
// waits for a peer, the host thread would stop there until the peer comes or
// the barrier gives up. Each file's kernels load at a communicator's setup
// instead (NCCL loads its kernels at init for the same reason).
cudaError_t load_reduce_kernels();
cudaError_t load_gather_kernels();
cudaError_t load_barrier_kernels();
cudaError_t load_low_latency_kernels();
// Loads `count` kernels into the current context (cudaFuncGetAttributes).
// Inline: a bench builds a kernel file without the rest of the library.
inline cudaError_t load_kernels(const void* const* kernels, std::size_t count) {
  cudaFuncAttributes attributes{};
  for (std::size_t i = 0; i < count; ++i)
    if (cudaError_t e = cudaFuncGetAttributes(&attributes, kernels[i]); e != cudaSuccess) return e;
  return cudaSuccess;
}
// All of the above, once per device and process; a failure is said and
// leaves the kernels to load at their first launch.
void load_collective_kernels(int device);

}  // namespace symmpool::detail
