// A stream-op barrier's writes, waits and watchdog notes go to the driver as
// one cuStreamBatchMemOp, in the order they were added (the fake driver runs
// the batch at once, writing into host memory).

#include "fake_fixture.hpp"
#include "stream_op_batch.hpp"

#include <symmpool/error.hpp>

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace symmpool::test {

using detail::StreamOpBatch;
using detail::WatchNotes;

// (operation, address, value) of each operation in the batch, in order.
struct Op {
  CUstreamBatchMemOpType type;
  CUdeviceptr address;
  std::uint32_t value;
  bool operator==(const Op& o) const { return type == o.type && address == o.address && value == o.value; }
};
constexpr auto W = CU_STREAM_MEM_OP_WRITE_VALUE_32;
constexpr auto Q = CU_STREAM_MEM_OP_WAIT_VALUE_32;

std::vector<Op> ops_of(const StreamOpBatch& batch) {
  std::vector<Op> out;
  for (int i = 0; i < batch.size(); ++i) {
    const CUstreamBatchMemOpParams& op = batch.operation(i);
    if (op.operation == W) {
      EXPECT_EQ(op.writeValue.flags, CU_STREAM_WRITE_VALUE_DEFAULT) << "a write without the fence before it";
      out.push_back({W, op.writeValue.address, static_cast<std::uint32_t>(op.writeValue.value)});
    } else {
      EXPECT_EQ(op.waitValue.flags, CU_STREAM_WAIT_VALUE_GEQ);
      out.push_back({op.operation, op.waitValue.address, static_cast<std::uint32_t>(op.waitValue.value)});
    }
  }
  return out;
}

class StreamOpBatchTest : public FakeDriverTest {
 protected:
  CUdeviceptr word(int i) { return reinterpret_cast<CUdeviceptr>(&words_[static_cast<std::size_t>(i)]); }
  std::array<std::uint32_t, 4> words_{};
};

TEST_F(StreamOpBatchTest, ABarrierIsOneDriverCallRunInTheOrderItWasBuilt) {
  StreamOpBatch batch;
  batch.write(word(0), 1);  // our epoch into each rank's slot
  batch.write(word(1), 1);
  batch.write(word(2), 1);  // the watchdog's "reached" note
  batch.wait_at_least(word(0), 1);
  batch.wait_at_least(word(1), 1);
  batch.write(word(3), 1);  // "passed"
  batch.write(word(2), 2);  // a later write to the same word lands last
  EXPECT_EQ(batch.size(), 7);
  fake().clear_calls();
  batch.enqueue(fake().api(), stream(1));
  EXPECT_EQ(fake().calls(), std::vector<std::string>{"cuStreamBatchMemOp"});
  EXPECT_EQ(words_, (std::array<std::uint32_t, 4>{1, 1, 2, 1}));
  EXPECT_EQ(batch.size(), 0) << "enqueued operations stay in the batch";
}

TEST_F(StreamOpBatchTest, AnEmptyBatchCallsNoDriver) {
  StreamOpBatch batch;
  fake().clear_calls();
  batch.enqueue(fake().api(), stream(1));
  EXPECT_TRUE(fake().calls().empty());
}

TEST_F(StreamOpBatchTest, WaitsAreGreaterOrEqualModuloTwoToThe32) {
  // The epochs wrap: 3 comes after 0xfffffff5 (the fake refuses a wait that
  // does not hold yet, where a stream would block).
  words_[0] = 3;
  StreamOpBatch batch;
  batch.wait_at_least(word(0), 0xfffffff5u);
  batch.wait_at_least(word(0), 3);
  batch.enqueue(fake().api(), stream(1));
  batch.wait_at_least(word(0), 4);
  expect_error<cuda_error>([&] { batch.enqueue(fake().api(), stream(1)); }, "cuStreamBatchMemOp");
}

TEST_F(StreamOpBatchTest, ARefusedBatchThrowsNamingTheCallAndIsNotSentAgain) {
  StreamOpBatch batch;
  batch.write(word(0), 5);
  fake().fail("cuStreamBatchMemOp", CUDA_ERROR_LAUNCH_FAILED);
  expect_error<cuda_error>([&] { batch.enqueue(fake().api(), stream(1)); }, "cuStreamBatchMemOp");
  EXPECT_EQ(batch.size(), 0);
  fake().clear_calls();
  batch.enqueue(fake().api(), stream(1));
  EXPECT_TRUE(fake().calls().empty());
  EXPECT_EQ(words_[0], 0u);
}

TEST_F(StreamOpBatchTest, ABarrierOfTheLargestGroupFitsAndOneMoreOperationIsRefused) {
  StreamOpBatch batch;
  for (int i = 0; i < StreamOpBatch::kCapacity; ++i) batch.write(word(i % 4), static_cast<std::uint32_t>(i));
  EXPECT_EQ(StreamOpBatch::kCapacity, 2 * detail::kMaxRanks + 2);
  expect_error<std::logic_error>([&] { batch.wait_at_least(word(0), 0); }, "stream-op batch");
  batch.enqueue(fake().api(), stream(1));
  EXPECT_EQ(fake().count("cuStreamBatchMemOp"), 1u);
}

TEST(StreamOpBarrier, WritesToEveryRankThenWaitsOnEveryRankBetweenTheWatchdogsNotes) {
  // Our epoch must be in every peer's pad before we wait (or two ranks wait
  // for each other forever), and the notes must bracket the waits (or the
  // watchdog times a stream that is not waiting, or misses one that is).
  const CUdeviceptr to_peers[] = {0x100, 0x200, 0x300}, mine[] = {0x10, 0x20, 0x30};
  const WatchNotes notes{0x900, 0x908};
  StreamOpBatch batch;
  detail::add_barrier(batch, to_peers, mine, 3, 41, notes);
  const std::vector<Op> expected{{W, 0x100, 41}, {W, 0x200, 41}, {W, 0x300, 41}, {W, 0x900, 41},
                                 {Q, 0x10, 41},  {Q, 0x20, 41},  {Q, 0x30, 41},  {W, 0x908, 41}};
  EXPECT_EQ(ops_of(batch), expected);
}

TEST(StreamOpBarrier, APointToPointWaitSitsBetweenTheWatchdogsNotes) {
  StreamOpBatch batch;
  detail::add_watched_wait(batch, 0x44, 7, WatchNotes{0x900, 0x908});
  EXPECT_EQ(ops_of(batch), (std::vector<Op>{{W, 0x900, 7}, {Q, 0x44, 7}, {W, 0x908, 7}}));
}

}  // namespace symmpool::test
