#include "fake_fixture.hpp"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace symmpool::test {

class MulticastGatingTest : public FakeDriverTest {
 protected:
  FakeDeviceConfig config() override {
    FakeDeviceConfig c;
    c.multicast_supported = supported_;
    return c;
  }
  bool supported_ = true;
};

TEST_F(MulticastGatingTest, EnabledOnlyWhenRequestedSupportedAndAllowed) {
  auto a = make_allocator(0, /*multicast=*/true);
  EXPECT_TRUE(a->multicast().enabled) << a->multicast().reason;
  EXPECT_EQ(a->granularity(), 4 * MiB);  // lcm of 2 MiB memory and 4 MiB multicast
  void* p = a->allocate(4096, stream(1));
  EXPECT_EQ(a->segments().at(0).size, 4 * MiB);
  EXPECT_TRUE(a->segments().at(0).multicast_capable);
  EXPECT_EQ(fake().count("cuMulticastGetGranularity"), 1u);
  a->deallocate(p, stream(1));
}

TEST_F(MulticastGatingTest, NotRequestedMeansNoMulticastCall) {
  auto a = make_allocator(0, /*multicast=*/false);
  EXPECT_FALSE(a->multicast().enabled);
  a->deallocate(a->allocate(4096, stream(1)), stream(1));
  EXPECT_EQ(fake().count_prefix("cuMulticast"), 0u);
}

// Each variable alone turns multicast off before any cuMulticast* call.
class MulticastEnvTest : public MulticastGatingTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(MulticastEnvTest, EnvironmentVariableDisablesMulticast) {
  const std::string which = GetParam();
  Environment env;
  env.nccl_nvls_disabled = which == "NCCL_NVLS_ENABLE";
  env.torch_symm_multicast_disabled = which == "TORCH_SYMM_MEM_DISABLE_MULTICAST";
  env.symmpool_multicast_disabled = which == "SYMMPOOL_DISABLE_MULTICAST";
  {
    auto a = make_allocator(0, /*multicast=*/true, env);
    EXPECT_FALSE(a->multicast().enabled);
    EXPECT_NE(a->multicast().reason.find(which), std::string::npos) << a->multicast().reason;
    a->deallocate(a->allocate(4096, stream(1)), stream(1));
    EXPECT_EQ(a->granularity(), 2 * MiB);
  }
  EXPECT_EQ(fake().count_prefix("cuMulticast"), 0u);
}

INSTANTIATE_TEST_SUITE_P(EachVariable, MulticastEnvTest,
                         ::testing::Values("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                           "SYMMPOOL_DISABLE_MULTICAST"));

class UnsupportedMulticastTest : public MulticastGatingTest {
 protected:
  void SetUp() override {
    supported_ = false;
    MulticastGatingTest::SetUp();
  }
};

TEST_F(UnsupportedMulticastTest, DeviceWithoutSupportMakesNoMulticastCall) {
  {
    auto a = make_allocator(0, /*multicast=*/true);
    EXPECT_FALSE(a->multicast().enabled);
    EXPECT_EQ(a->multicast().reason, "device does not support multicast");
    a->deallocate(a->allocate(4096, stream(1)), stream(1));
  }
  EXPECT_EQ(fake().count_prefix("cuMulticast"), 0u);
}

TEST(Environment, ReadsTheThreeVariables) {
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  ::setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 1);
  ::setenv("SYMMPOOL_DISABLE_MULTICAST", "true", 1);
  ::setenv("SYMMPOOL_ENABLE_MULTICAST", "1", 1);
  Environment env = Environment::from_process();
  EXPECT_TRUE(env.nccl_nvls_disabled);
  EXPECT_TRUE(env.torch_symm_multicast_disabled);
  EXPECT_TRUE(env.symmpool_multicast_disabled);
  EXPECT_TRUE(env.multicast_requested);
  ::setenv("NCCL_NVLS_ENABLE", "1", 1);
  ::unsetenv("TORCH_SYMM_MEM_DISABLE_MULTICAST");
  ::setenv("SYMMPOOL_DISABLE_MULTICAST", "0", 1);
  ::unsetenv("SYMMPOOL_ENABLE_MULTICAST");
  env = Environment::from_process();
  EXPECT_FALSE(env.multicast_disabled_by_env());
  EXPECT_FALSE(env.multicast_requested);
  ::unsetenv("NCCL_NVLS_ENABLE");
  ::unsetenv("SYMMPOOL_DISABLE_MULTICAST");
}

}  // namespace symmpool::test

namespace symmpool::test {

TEST(Environment, ReadsWhetherSegmentsMoveBetweenStreams) {
  ::unsetenv("SYMMPOOL_SEGMENT_MOVES");
  EXPECT_TRUE(Environment::from_process().segment_moves);
  ::setenv("SYMMPOOL_SEGMENT_MOVES", "0", 1);
  EXPECT_FALSE(Environment::from_process().segment_moves);
  ::setenv("SYMMPOOL_SEGMENT_MOVES", "off", 1);
  EXPECT_FALSE(Environment::from_process().segment_moves);
  ::setenv("SYMMPOOL_SEGMENT_MOVES", "1", 1);
  EXPECT_TRUE(Environment::from_process().segment_moves);
  ::unsetenv("SYMMPOOL_SEGMENT_MOVES");
}

}  // namespace symmpool::test
