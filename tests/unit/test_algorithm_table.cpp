#include <symmpool/algorithm_table.hpp>

#include <gtest/gtest.h>

namespace symmpool::test {

constexpr std::size_t MiB = std::size_t{1} << 20;

TEST(AlgorithmTable, FollowsTheTwoGpuMeasurements) {
  for (std::size_t bytes : {std::size_t{8} << 10, 64 * MiB, 1024 * MiB})
    for (auto op : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce})
      EXPECT_EQ(choose_engine(op, bytes, 2), Engine::kSymmpool) << bytes;
  EXPECT_EQ(choose_algorithm(CollectiveKind::kAllGather, 16 * MiB, 2), Algorithm::kKernel);
  EXPECT_EQ(choose_algorithm(CollectiveKind::kAllGather, 16 * MiB + 1, 2), Algorithm::kCopyEnginePush);
  EXPECT_EQ(choose_algorithm(CollectiveKind::kReduceScatter, 1024 * MiB, 2), Algorithm::kOneShot);
  EXPECT_EQ(choose_algorithm(CollectiveKind::kAllReduce, 8 << 10, 2), Algorithm::kTwoShot);
}

TEST(AlgorithmTable, UnmeasuredWorldSizesUseNccl) {
  for (int world : {1, 4, 8})
    for (auto op : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce})
      EXPECT_EQ(choose_engine(op, 1024 * MiB, world), Engine::kNccl) << world;
}

}  // namespace symmpool::test
