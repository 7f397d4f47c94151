#include "stream_op_batch.hpp"

#include <symmpool/error.hpp>

#include <cstring>
#include <string>
#include <type_traits>

namespace symmpool::detail {

namespace {

// The write and wait parameters are two members of one union, alike in the
// fields set here; a 64-bit operation's value goes into value64.
template <typename Params, typename Value>
void set(Params& op, CUstreamBatchMemOpType operation, CUdeviceptr address, Value value, unsigned int flags) {
  static_assert(std::is_same_v<Value, std::uint32_t> || std::is_same_v<Value, std::uint64_t>);
  op.operation = operation;
  op.address = address;
  if constexpr (std::is_same_v<Value, std::uint64_t>)
    op.value64 = value;
  else
    op.value = value;
  op.flags = flags;
}

}  // namespace

CUstreamBatchMemOpParams& StreamOpBatch::add() {
  SYMMPOOL_EXPECTS(count_ < kCapacity,
                   "stream-op batch: more than " + std::to_string(kCapacity) + " operations");
  CUstreamBatchMemOpParams& op = ops_[static_cast<std::size_t>(count_++)];
  std::memset(&op, 0, sizeof op);  // every member of the union, not only the first
  return op;
}

void StreamOpBatch::write(CUdeviceptr address, std::uint32_t value) {
  set(add().writeValue, CU_STREAM_MEM_OP_WRITE_VALUE_32, address, value, CU_STREAM_WRITE_VALUE_DEFAULT);
}

void StreamOpBatch::wait_at_least(CUdeviceptr address, std::uint32_t value) {
  set(add().waitValue, CU_STREAM_MEM_OP_WAIT_VALUE_32, address, value, CU_STREAM_WAIT_VALUE_GEQ);
}

void StreamOpBatch::write64(CUdeviceptr address, std::uint64_t value) {
  set(add().writeValue, CU_STREAM_MEM_OP_WRITE_VALUE_64, address, value, CU_STREAM_WRITE_VALUE_DEFAULT);
}

void StreamOpBatch::wait_at_least64(CUdeviceptr address, std::uint64_t value) {
  set(add().waitValue, CU_STREAM_MEM_OP_WAIT_VALUE_64, address, value, CU_STREAM_WAIT_VALUE_GEQ);
}

void StreamOpBatch::enqueue(const DriverApi& drv, CUstream stream) {
  if (count_ == 0) return;
  const auto count = static_cast<unsigned int>(count_);
  count_ = 0;  // empty whatever the driver says: a failure fails the communicator
  SYMMPOOL_CU_TRY(drv, cuStreamBatchMemOp(stream, count, ops_.data(), 0));
}

void add_barrier(StreamOpBatch& batch, const CUdeviceptr* to_peers, const CUdeviceptr* mine, int ranks,
                 std::uint32_t value, WatchNotes notes) {
  for (int r = 0; r < ranks; ++r) batch.write(to_peers[r], value);
  batch.write(notes.reached, value);
  for (int r = 0; r < ranks; ++r) batch.wait_at_least(mine[r], value);
  batch.write(notes.passed, value);
}

void add_checked_meeting(StreamOpBatch& batch, const CUdeviceptr* to_peers, const CUdeviceptr* mine,
                         const CUdeviceptr* call_words, int ranks, std::uint32_t epoch, std::uint32_t digest,
                         std::uint32_t call_number, WatchNotes notes) {
  const std::uint64_t low = checked_low(epoch, digest), high = checked_high(epoch, digest);
  for (int r = 0; r < ranks; ++r) batch.write64(call_words[r], (std::uint64_t{call_number} << 32) | digest);
  for (int r = 0; r < ranks; ++r) {
    batch.write64(to_peers[r], low);
    batch.write64(to_peers[r] + sizeof(std::uint64_t), high);
  }
  batch.write(notes.reached, epoch);
  for (int r = 0; r < ranks; ++r) {
    batch.wait_at_least64(mine[r], low);
    batch.wait_at_least64(mine[r] + sizeof(std::uint64_t), high);
  }
  batch.write(notes.passed, epoch);
}

void add_watched_wait(StreamOpBatch& batch, CUdeviceptr slot, std::uint32_t value, WatchNotes notes) {
  batch.write(notes.reached, value);
  batch.wait_at_least(slot, value);
  batch.write(notes.passed, value);
}

}  // namespace symmpool::detail
