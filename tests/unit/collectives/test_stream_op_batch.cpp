// A stream-op barrier's writes, waits and watchdog notes go to the driver as
// one cuStreamBatchMemOp, in the order they were added (the fake driver runs
// the batch at once, writing into host memory).

#include "fake_fixture.hpp"
#include "stream_op_batch.hpp"
#include "stream_op_watchdog.hpp"

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

TEST_F(StreamOpBatchTest, ACheckedMeetingOfTheLargestGroupFits) {
  std::array<std::uint64_t, 2 * detail::kMaxRanks> pairs{};
  std::array<std::uint64_t, detail::kMaxRanks> calls{};
  std::array<CUdeviceptr, detail::kMaxRanks> to{}, mine{}, call_words{};
  for (std::size_t r = 0; r < to.size(); ++r) {
    to[r] = mine[r] = reinterpret_cast<CUdeviceptr>(
        &pairs[2 * r]);  // each pair written where it is awaited: the waits pass
    call_words[r] = reinterpret_cast<CUdeviceptr>(&calls[r]);
  }
  StreamOpBatch batch;
  detail::add_checked_meeting(batch, to.data(), mine.data(), call_words.data(), detail::kMaxRanks, 1, 0x1234,
                              9, WatchNotes{word(0), word(1)});
  EXPECT_EQ(batch.size(), StreamOpBatch::kCapacity);
  batch.enqueue(fake().api(), stream(1));
  EXPECT_EQ(calls[3], (std::uint64_t{9} << 32) | 0x1234)
      << "the call number and digest, as a barrier kernel's";
}

TEST_F(StreamOpBatchTest, ABarrierOfTheLargestGroupFitsAndOneMoreOperationIsRefused) {
  StreamOpBatch batch;
  for (int i = 0; i < StreamOpBatch::kCapacity; ++i) batch.write(word(i % 4), static_cast<std::uint32_t>(i));
  EXPECT_EQ(StreamOpBatch::kCapacity, 5 * detail::kMaxRanks + 2);
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

// Two ranks' checked meeting run through the fake: rank 0's batch after
// rank 1's writes (as if rank 1 came first with `their_digest`).
class CheckedMeeting : public FakeDriverTest {
 protected:
  // pairs_[rank][holder]: rank's pair as `holder`'s pads keep it.
  void enqueue_rank(int rank, std::uint32_t epoch, std::uint32_t digest) {
    CUdeviceptr to[2], mine[2], calls[2];
    for (int r = 0; r < 2; ++r) {
      to[r] = reinterpret_cast<CUdeviceptr>(&pairs_[rank][r][0]);
      mine[r] = reinterpret_cast<CUdeviceptr>(&pairs_[r][rank][0]);
      calls[r] = reinterpret_cast<CUdeviceptr>(&call_words_[r][rank]);
    }
    StreamOpBatch batch;
    detail::add_checked_meeting(batch, to, mine, calls, 2, epoch, digest, epoch, notes_);
    batch.enqueue(fake().api(), stream(1));
  }
  // Rank 1 writes only (its waits would need rank 0's values first).
  void rank1_writes(std::uint32_t epoch, std::uint32_t digest) {
    for (int holder = 0; holder < 2; ++holder) {
      pairs_[1][holder][0] = detail::checked_low(epoch, digest);
      pairs_[1][holder][1] = detail::checked_high(epoch, digest);
    }
  }
  bool rank0_passes(std::uint32_t epoch, std::uint32_t digest) {
    try {
      enqueue_rank(0, epoch, digest);
      return true;
    } catch (const cuda_error&) {  // the fake's way of saying "the stream would block here"
      return false;
    }
  }
  alignas(8) std::uint64_t pairs_[2][2][2] = {};
  alignas(8) std::uint64_t call_words_[2][2] = {};
  alignas(8) std::uint32_t note_words_[2] = {};
  WatchNotes notes_{reinterpret_cast<CUdeviceptr>(&note_words_[0]),
                    reinterpret_cast<CUdeviceptr>(&note_words_[1])};
};

TEST_F(CheckedMeeting, PassesWhereTheDigestsAreEqual) {
  rank1_writes(1, 0xabcd1234);
  EXPECT_TRUE(rank0_passes(1, 0xabcd1234));
  EXPECT_EQ(call_words_[1][0], (std::uint64_t{1} << 32) | 0xabcd1234)
      << "rank 0 announced its call to rank 1";
}

TEST_F(CheckedMeeting, HoldsWhereTheDigestsDifferEitherWay) {
  // One GEQ wait passes a larger digest, the other a smaller: only equal
  // digests pass both (with the digests' high bit set, too).
  for (std::uint32_t theirs : {0xabcd1235u, 0xabcd1233u, 0x00000001u, 0xffffffffu}) {
    rank1_writes(1, theirs);
    EXPECT_FALSE(rank0_passes(1, 0xabcd1234)) << std::hex << theirs;
  }
}

TEST_F(CheckedMeeting, HoldsUntilThePeerArrivesAndPassesOncePeersMovedOn) {
  EXPECT_FALSE(rank0_passes(1, 7)) << "rank 1 has written nothing";
  // Rank 1 already met us at epoch 1 (it compared our digest with its
  // own) and wrote its next meeting's values before our wait ran.
  rank1_writes(2, 99);
  EXPECT_TRUE(rank0_passes(1, 7));
}

TEST_F(CheckedMeeting, EpochsThatWrapAroundCompareAsLater) {
  rank1_writes(0, 5);  // epoch 0 comes after 0xffffffff
  EXPECT_TRUE(rank0_passes(0xffffffffu, 6));
}

TEST(CheckedPair, TheWatchdogTellsAMissingRankFromOneAtAnotherCall) {
  using detail::judge_pair;
  using detail::PairVerdict;
  constexpr std::uint32_t ours = 0x5151;
  EXPECT_EQ(judge_pair(detail::checked_low(4, ours), detail::checked_high(4, ours), 4, ours),
            PairVerdict::kArrived);
  EXPECT_EQ(judge_pair(detail::checked_low(5, 1), detail::checked_high(5, 1), 4, ours), PairVerdict::kArrived)
      << "a later meeting: it compared ours at this one";
  EXPECT_EQ(judge_pair(detail::checked_low(3, ours), detail::checked_high(3, ours), 4, ours),
            PairVerdict::kMissing);
  EXPECT_EQ(judge_pair(0, 0, 4, ours), PairVerdict::kMissing) << "never written";
  EXPECT_EQ(judge_pair(detail::checked_low(4, ours + 1), detail::checked_high(4, ours + 1), 4, ours),
            PairVerdict::kAtAnotherCall);
  EXPECT_EQ(judge_pair(detail::checked_low(4, ours - 1), detail::checked_high(4, ours - 1), 4, ours),
            PairVerdict::kAtAnotherCall);
  EXPECT_EQ(
      judge_pair(detail::checked_low(0xffffffffu, ours), detail::checked_high(0xffffffffu, ours), 0, ours),
      PairVerdict::kMissing)
      << "epoch 0 comes after 0xffffffff";
}

}  // namespace symmpool::test
