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

namespace symmpool::test {

using detail::StreamOpBatch;

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

}  // namespace symmpool::test
