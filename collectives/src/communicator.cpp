#include "kernels.hpp"

#include <symmpool/communicator.hpp>
#include <symmpool/cuda_try.hpp>
#include <symmpool/detail/format.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace symmpool {

namespace {

constexpr int kBarrierTimeoutSeconds = 30;
constexpr std::size_t kPadWords = 2 * Communicator::kMaxRanks;  // kernel row, stream-op row

bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

Communicator::Communicator(SymmetricHeap& heap, CachingAllocator& allocator)
    : heap_(heap), allocator_(allocator) {
  SYMMPOOL_EXPECTS(world() <= kMaxRanks, "symmpool collectives support up to " +
                                             std::to_string(kMaxRanks) + " ranks, got " +
                                             std::to_string(world()));
  int device = -1;
  SYMMPOOL_CUDA_TRY(cudaGetDevice(&device));
  SYMMPOOL_EXPECTS(device == allocator_.device(),
                   "the current device is " + std::to_string(device) + " but the heap is on device " +
                       std::to_string(allocator_.device()));
  // Every rank makes these allocations in the same order: symmetric offsets.
  pads_ = static_cast<std::uint32_t*>(allocator_.allocate(kPadWords * sizeof(std::uint32_t), nullptr));
  kernel_epoch_ = static_cast<std::uint32_t*>(allocator_.allocate(sizeof(std::uint32_t), nullptr));
  SYMMPOOL_CUDA_TRY(cudaMemset(pads_, 0, kPadWords * sizeof(std::uint32_t)));
  SYMMPOOL_CUDA_TRY(cudaMemset(kernel_epoch_, 0, sizeof(std::uint32_t)));
  SYMMPOOL_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&error_flag_), sizeof(int), cudaHostAllocMapped));
  *error_flag_ = 0;
  SYMMPOOL_CUDA_TRY(cudaDeviceSynchronize());
  heap_.sync();  // also a barrier: no peer signals before every pad is zeroed
  heap_.check_symmetric(pads_, kPadWords * sizeof(std::uint32_t), "signal pads");
  // Fixed for the communicator's life; asking per call cost ~1 ms of host
  // time (the clock-rate query), measured on H200.
  for (int p = 0; p < world(); ++p)
    peer_pads_.peer[p] = static_cast<std::uint32_t*>(heap_.peer_ptr(pads_, p));
  int khz = 0;
  SYMMPOOL_CUDA_TRY(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, allocator_.device()));
  timeout_cycles_ = static_cast<long long>(khz) * 1000LL * kBarrierTimeoutSeconds;
}

Communicator::~Communicator() {
  cudaDeviceSynchronize();
  allocator_.deallocate(pads_, nullptr);
  allocator_.deallocate(kernel_epoch_, nullptr);
  if (scratch_) allocator_.deallocate(scratch_, nullptr);
  cudaFreeHost(error_flag_);
}

void Communicator::check_errors() {
  const int missing = *static_cast<volatile int*>(error_flag_);
  if (missing == 0) return;
  *error_flag_ = 0;
  throw timeout_error("symmpool: rank " + std::to_string(rank()) + " waited more than " +
                      std::to_string(kBarrierTimeoutSeconds) + " s in a barrier for rank " +
                      std::to_string(missing - 1) + " (peer dead or collectives out of order)");
}

void Communicator::barrier(cudaStream_t stream, BarrierKind kind) {
  check_errors();
  const int n = world();
  if (kind == BarrierKind::kKernel) {
    SYMMPOOL_CUDA_TRY(detail::launch_barrier(peer_pads_, pads_, kernel_epoch_, rank(), n,
                                             error_flag_, timeout_cycles_, stream));
    return;
  }
  // SM-free: write our epoch into each peer's pad, then wait on our own.
  const DriverApi& drv = real_driver();
  const std::uint32_t epoch = ++stream_op_epoch_;
  auto cu = reinterpret_cast<CUstream>(stream);
  for (int p = 0; p < n; ++p) {
    auto* slot = peer_pads_.peer[p] + kMaxRanks + rank();
    SYMMPOOL_CU_TRY(drv, cuStreamWriteValue32(cu, reinterpret_cast<CUdeviceptr>(slot), epoch,
                                              CU_STREAM_WRITE_VALUE_DEFAULT));
  }
  for (int p = 0; p < n; ++p) {
    SYMMPOOL_CU_TRY(drv, cuStreamWaitValue32(cu, reinterpret_cast<CUdeviceptr>(pads_ + kMaxRanks + p),
                                             epoch, CU_STREAM_WAIT_VALUE_GEQ));
  }
}

void Communicator::require_symmetric(const void* ptr, std::size_t bytes, const char* what) {
  if (heap_.needs_sync()) {
    heap_.sync();
    checked_.clear();
  }
  if (checked_.count({ptr, bytes})) return;
  heap_.check_symmetric(ptr, bytes, what);
  checked_[{ptr, bytes}] = true;
}

void Communicator::all_gather(const void* in, void* out, std::size_t bytes_per_rank,
                              cudaStream_t stream, BarrierKind kind) {
  check_errors();
  if (bytes_per_rank == 0) return;
  auto* dst = static_cast<char*>(out);
  const int n = world(), me = rank();
  const std::size_t total = bytes_per_rank * static_cast<std::size_t>(n);
  // In place (FSDP2's way), each rank's input is its own slice of the output,
  // so peer p's input is its output's slice p; otherwise the inputs must be
  // symmetric themselves.
  const bool in_place = in == dst + static_cast<std::size_t>(me) * bytes_per_rank;
  if (in_place)
    require_symmetric(out, total, "all_gather output (in place)");
  else
    require_symmetric(in, bytes_per_rank, "all_gather input");
  barrier(stream, kind);  // every input is ready
  for (int k = 1; k < n; ++k) {
    const int p = (me + k) % n;  // spread the pulls over the peers
    const char* src = in_place
                          ? static_cast<const char*>(heap_.peer_ptr(out, p)) + static_cast<std::size_t>(p) * bytes_per_rank
                          : static_cast<const char*>(heap_.peer_ptr(in, p));
    SYMMPOOL_CUDA_TRY(cudaMemcpyAsync(dst + static_cast<std::size_t>(p) * bytes_per_rank, src,
                                      bytes_per_rank, cudaMemcpyDeviceToDevice, stream));
  }
  if (!in_place)
    SYMMPOOL_CUDA_TRY(cudaMemcpyAsync(dst + static_cast<std::size_t>(me) * bytes_per_rank, in,
                                      bytes_per_rank, cudaMemcpyDeviceToDevice, stream));
  barrier(stream, kind);  // nobody reuses its input while a peer still reads it
}

void* Communicator::scratch(std::size_t bytes) {
  if (scratch_bytes_ >= bytes) return scratch_;
  if (scratch_) {
    SYMMPOOL_CUDA_TRY(cudaDeviceSynchronize());
    allocator_.deallocate(scratch_, nullptr);
  }
  scratch_ = allocator_.allocate(bytes, nullptr);
  scratch_bytes_ = bytes;
  return scratch_;
}

void Communicator::reduce(const void* in, std::size_t in_count, void* out, std::size_t count,
                          std::size_t src_offset, DataType type, ReduceOp op, cudaStream_t stream) {
  const std::size_t es = element_size(type);
  const std::size_t in_bytes = in_count * es;
  require_symmetric(in, in_bytes, "reduction input");
  detail::PeerPointers peers{};
  for (int p = 0; p < world(); ++p) peers.ptr[p] = heap_.peer_ptr(in, p);
  // Peers read our input until the second barrier: results that would land
  // on it go to scratch first.
  const bool aliased = overlap(in, in_bytes, out, count * es);
  void* dst = aliased ? scratch(count * es) : out;
  const float scale = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(world()) : 1.0f;
  barrier(stream, BarrierKind::kKernel);
  SYMMPOOL_CUDA_TRY(detail::launch_reduce(peers, dst, count, src_offset, world(), type, scale, stream));
  barrier(stream, BarrierKind::kKernel);
  if (aliased) SYMMPOOL_CUDA_TRY(cudaMemcpyAsync(out, dst, count * es, cudaMemcpyDeviceToDevice, stream));
}

void Communicator::reduce_scatter(const void* in, void* out, std::size_t count, DataType type,
                                  ReduceOp op, cudaStream_t stream) {
  check_errors();
  if (count == 0) return;
  reduce(in, count * static_cast<std::size_t>(world()), out, count,
         count * static_cast<std::size_t>(rank()), type, op, stream);
}

void Communicator::all_reduce(const void* in, void* out, std::size_t count, DataType type,
                              ReduceOp op, cudaStream_t stream) {
  check_errors();
  if (count == 0) return;
  reduce(in, count, out, count, 0, type, op, stream);
}

}  // namespace symmpool
