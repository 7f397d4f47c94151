#include <symmpool/algorithm_table.hpp>

#include <gtest/gtest.h>

namespace symmpool::test {

constexpr std::size_t MiB = std::size_t{1} << 20;

TEST(AlgorithmTable, FollowsTheTwoGpuMeasurements) {
  EXPECT_EQ(choose_engine(CollectiveKind::kAllGather, 16 * MiB, 2), Engine::kNccl);
  EXPECT_EQ(choose_engine(CollectiveKind::kAllGather, 64 * MiB, 2), Engine::kSymmpool);
  EXPECT_EQ(choose_engine(CollectiveKind::kReduceScatter, 1 * MiB, 2), Engine::kNccl);
  EXPECT_EQ(choose_engine(CollectiveKind::kReduceScatter, 4 * MiB, 2), Engine::kSymmpool);
  EXPECT_EQ(choose_engine(CollectiveKind::kAllReduce, 4 * MiB - 1, 2), Engine::kNccl);
  EXPECT_EQ(choose_engine(CollectiveKind::kAllReduce, 1024 * MiB, 2), Engine::kSymmpool);
}

TEST(AlgorithmTable, UnmeasuredWorldSizesUseNccl) {
  for (int world : {1, 4, 8})
    for (auto op : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce})
      EXPECT_EQ(choose_engine(op, 1024 * MiB, world), Engine::kNccl) << world;
}

}  // namespace symmpool::test
