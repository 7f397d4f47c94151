#include <symmpool/algorithm_table.hpp>

#include <gtest/gtest.h>

namespace symmpool::test {

constexpr std::size_t MiB = std::size_t{1} << 20;

TEST(AlgorithmTable, FollowsTheTwoGpuMeasurements) {
  for (std::size_t bytes : {std::size_t{8} << 10, 64 * MiB, 1024 * MiB})
    for (auto op : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter})
      EXPECT_EQ(choose_engine(op, bytes, 2), Engine::kSymmpool) << bytes;
  for (std::size_t bytes : {std::size_t{1} << 10, 256 * MiB, 256 * MiB + 2, 1024 * MiB})
    EXPECT_EQ(choose_engine(CollectiveKind::kAllReduce, bytes, 2), Engine::kSymmpool) << bytes;
  EXPECT_EQ(choose_algorithm(CollectiveKind::kAllGather, 16 * MiB, 2), Algorithm::kKernel);
  EXPECT_EQ(choose_algorithm(CollectiveKind::kAllGather, 16 * MiB + 1, 2), Algorithm::kCopyEnginePush);
  EXPECT_EQ(choose_algorithm(CollectiveKind::kReduceScatter, 1024 * MiB, 2), Algorithm::kOneShot);
  EXPECT_EQ(choose_algorithm(CollectiveKind::kAllReduce, 1, 2), Algorithm::kLowLatency);
  EXPECT_EQ(choose_algorithm(CollectiveKind::kAllReduce, 128 << 10, 2), Algorithm::kLowLatency);
  EXPECT_EQ(choose_algorithm(CollectiveKind::kAllReduce, (128 << 10) + 2, 2), Algorithm::kTwoShot);
  EXPECT_EQ(choose_algorithm(CollectiveKind::kAllReduce, 1024 * MiB, 2), Algorithm::kTwoShot);
}

TEST(AlgorithmTable, FollowsTheFourGpuMeasurements) {
  for (std::size_t bytes : {std::size_t{8} << 10, 64 * MiB, 1024 * MiB})
    for (auto op : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter})
      EXPECT_EQ(choose_engine(op, bytes, 4), Engine::kSymmpool) << bytes;
  EXPECT_EQ(choose_engine(CollectiveKind::kAllReduce, 8 << 10, 4), Engine::kSymmpool);
  EXPECT_EQ(choose_engine(CollectiveKind::kAllReduce, 16 * MiB, 4), Engine::kSymmpool);
  EXPECT_EQ(choose_engine(CollectiveKind::kAllReduce, 64 * MiB, 4), Engine::kNccl);
  EXPECT_EQ(choose_algorithm(CollectiveKind::kAllGather, 64 << 10, 4), Algorithm::kKernel);
  EXPECT_EQ(choose_algorithm(CollectiveKind::kAllGather, 256 * MiB, 4), Algorithm::kCopyEnginePush);
  EXPECT_EQ(choose_algorithm(CollectiveKind::kAllReduce, 8 << 10, 4), Algorithm::kTwoShot);  // LL unmeasured
}

TEST(AlgorithmTable, FusedReductionsUpToTheirMeasuredLimit) {
  for (std::size_t per_peer : {16 * MiB, 16 * MiB + 1, 128 * MiB, 1024 * MiB})  // every size, as measured
    EXPECT_TRUE(fused_kernel(per_peer, 2)) << per_peer;
  for (int world : {1, 3, 4, 8}) {  // not measured with the 8-load kernel: the limit of before
    EXPECT_TRUE(fused_kernel(1 * MiB, world)) << world;
    EXPECT_FALSE(fused_kernel(1 * MiB + 1, world)) << world;
  }
}

TEST(AlgorithmTable, UnmeasuredWorldSizesUseNccl) {
  for (int world : {1, 3, 8})
    for (auto op : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce})
      for (std::size_t bytes : {std::size_t{8} << 10, 1024 * MiB})
        EXPECT_EQ(choose_engine(op, bytes, world), Engine::kNccl) << world << " " << bytes;
}

// A measured NCCL-window range takes its op, world size, capture and sizes,
// and nothing else; the table has none yet (measured at 1 rank only).
TEST(AlgorithmTable, NcclWindowRangesTakeTheirCallsOnly) {
  constexpr std::array<NcclWindowRange, 1> ranges{
      {{CollectiveKind::kAllGather, 2, /*captured=*/true, 64 << 10, 2 * MiB}}};
  EXPECT_EQ(choose_engine(CollectiveKind::kAllGather, 64 << 10, 2, true, ranges), Engine::kNcclWindows);
  EXPECT_EQ(choose_engine(CollectiveKind::kAllGather, 2 * MiB, 2, true, ranges), Engine::kNcclWindows);
  EXPECT_EQ(choose_engine(CollectiveKind::kAllGather, 2 * MiB + 1, 2, true, ranges), Engine::kSymmpool);
  EXPECT_EQ(choose_engine(CollectiveKind::kAllGather, (64 << 10) - 1, 2, true, ranges), Engine::kSymmpool);
  EXPECT_EQ(choose_engine(CollectiveKind::kAllGather, 1 * MiB, 2, false, ranges), Engine::kSymmpool);
  EXPECT_EQ(choose_engine(CollectiveKind::kReduceScatter, 1 * MiB, 2, true, ranges), Engine::kSymmpool);
  EXPECT_EQ(choose_engine(CollectiveKind::kAllGather, 1 * MiB, 8, true, ranges), Engine::kNccl);
  EXPECT_TRUE(has_nccl_window_ranges(2, ranges));
  EXPECT_FALSE(has_nccl_window_ranges(4, ranges));
  EXPECT_TRUE(kMeasuredNcclWindowRanges.empty());
}

}  // namespace symmpool::test
