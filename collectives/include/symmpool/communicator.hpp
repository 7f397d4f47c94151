#pragma once
// Zero-copy intra-node collectives on a symmetric heap. Every call is
// collective (all ranks, same order, same sizes), runs on the caller's
// stream, and checks that its buffers are symmetric before touching a peer.
//   all_gather     copy engines pull each peer's input (no SM)
//   reduce_scatter one-shot SM kernel, 16-byte loads, fp32 accumulation
//   all_reduce     one-shot SM kernel, same
//   barrier        kernel or stream memory operations on signal pads

#include <symmpool/collective_types.hpp>
#include <symmpool/detail/peer_pointers.hpp>
#include <symmpool/symmetric_heap.hpp>

#include <cuda_runtime_api.h>

#include <map>
#include <utility>

namespace symmpool {

class Communicator {
 public:
  static constexpr int kMaxRanks = detail::kMaxRanks;

  // Collective: allocates and zeroes the signal pads, then syncs the heap.
  Communicator(SymmetricHeap& heap, CachingAllocator& allocator);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  void barrier(cudaStream_t stream, BarrierKind kind = BarrierKind::kKernel);

  // out holds world * bytes_per_rank; in may be out's slice of this rank.
  void all_gather(const void* in, void* out, std::size_t bytes_per_rank, cudaStream_t stream,
                  BarrierKind kind = BarrierKind::kKernel);
  // in holds world * count elements, out count.
  void reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                      cudaStream_t stream);
  void all_reduce(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                  cudaStream_t stream);

  // Raises the error a barrier kernel recorded (a peer that never arrived).
  void check_errors();

  int rank() const { return heap_.rank(); }
  int world() const { return heap_.world(); }

 private:
  void require_symmetric(const void* ptr, std::size_t bytes, const char* what);
  // out[i] = op over ranks of in[src_offset + i]; in holds in_count elements.
  void reduce(const void* in, std::size_t in_count, void* out, std::size_t count,
              std::size_t src_offset, DataType type, ReduceOp op, cudaStream_t stream);
  void* scratch(std::size_t bytes);

  SymmetricHeap& heap_;
  CachingAllocator& allocator_;
  std::uint32_t* pads_ = nullptr;         // [2][world]: kernel pads, stream-op pads
  std::uint32_t* kernel_epoch_ = nullptr;  // device-side counter of kernel barriers
  std::uint32_t stream_op_epoch_ = 0;      // host-side counter of stream-op barriers
  detail::PadPointers peer_pads_{};        // every rank's pads, mapped here
  long long timeout_cycles_ = 0;           // barrier kernel's patience
  int* error_flag_ = nullptr;              // host-mapped: set by a barrier that timed out
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
  std::map<std::pair<const void*, std::size_t>, bool> checked_;  // buffers already checked
};

}  // namespace symmpool
