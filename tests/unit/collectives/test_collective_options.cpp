#include <symmpool/collective_options.hpp>
#include <symmpool/error.hpp>

#include <gtest/gtest.h>

#include <string>

namespace symmpool::test {

namespace {

// The text of the logic_error that parsing `env` raises ("" if none).
std::string parse_error(const CollectiveEnvironment& env) {
  try {
    CollectiveOptions::from(env);
  } catch (const logic_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(CollectiveOptions, UnsetVariablesKeepTheDefaults) {
  const CollectiveOptions options = CollectiveOptions::from(CollectiveEnvironment{});
  EXPECT_EQ(options.max_blocks, 64);
  EXPECT_EQ(options.copy_streams, 1);
  EXPECT_FALSE(options.barrier_timeout.has_value());
  EXPECT_FALSE(options.all_reduce_algorithm.has_value());
  EXPECT_FALSE(options.reduce_scatter_algorithm.has_value());
  EXPECT_EQ(options.two_step_piece_bytes, 32 << 20);
  EXPECT_FALSE(options.fused_max_bytes.has_value());  // the table's limit
}

TEST(CollectiveOptions, ReadsEachVariable) {
  CollectiveEnvironment env;
  env.max_blocks = "528";
  env.copy_streams = "8";
  env.barrier_timeout = "86400";
  env.two_step_piece_bytes = "65536";
  env.fused_max_bytes = "1048576";
  const CollectiveOptions options = CollectiveOptions::from(env);
  EXPECT_EQ(options.max_blocks, 528);
  EXPECT_EQ(options.copy_streams, 8);
  ASSERT_TRUE(options.barrier_timeout.has_value());
  EXPECT_EQ(options.barrier_timeout->count(), 86400);
  EXPECT_EQ(options.two_step_piece_bytes, 65536);
  ASSERT_TRUE(options.fused_max_bytes.has_value());
  EXPECT_EQ(*options.fused_max_bytes, std::size_t{1} << 20);
  env.fused_max_bytes = "0";  // every reduction between barrier kernels
  EXPECT_EQ(CollectiveOptions::from(env).fused_max_bytes, std::size_t{0});
}

// By the names the algorithms go by everywhere else (to_string).
TEST(CollectiveOptions, ReadsTheAllReduceAlgorithmByName) {
  for (Algorithm a :
       {Algorithm::kOneShot, Algorithm::kTwoShot, Algorithm::kTwoStep, Algorithm::kLowLatency}) {
    CollectiveEnvironment env;
    env.all_reduce_algorithm = to_string(a);
    const CollectiveOptions options = CollectiveOptions::from(env);
    ASSERT_TRUE(options.all_reduce_algorithm.has_value()) << to_string(a);
    EXPECT_EQ(*options.all_reduce_algorithm, a);
  }
  for (const char* bad : {"copy-engine push", "auto", "LL", "low_latency", " one-shot"}) {
    CollectiveEnvironment env;
    env.all_reduce_algorithm = bad;
    EXPECT_NE(parse_error(env).find("SYMMPOOL_ALL_REDUCE_ALGORITHM must be one-shot, two-shot, two-step or "
                                    "low-latency, got '" +
                                    std::string(bad) + "'"),
              std::string::npos)
        << bad;
  }
}

TEST(CollectiveOptions, ReadsTheReduceScatterAlgorithmByName) {
  for (Algorithm a : {Algorithm::kOneShot, Algorithm::kTwoStep}) {
    CollectiveEnvironment env;
    env.reduce_scatter_algorithm = to_string(a);
    const CollectiveOptions options = CollectiveOptions::from(env);
    ASSERT_TRUE(options.reduce_scatter_algorithm.has_value()) << to_string(a);
    EXPECT_EQ(*options.reduce_scatter_algorithm, a);
  }
  for (const char* bad : {"two-shot", "low-latency", "auto", "two_step"}) {
    CollectiveEnvironment env;
    env.reduce_scatter_algorithm = bad;
    EXPECT_NE(parse_error(env).find("SYMMPOOL_REDUCE_SCATTER_ALGORITHM must be one-shot or two-step, got '" +
                                    std::string(bad) + "'"),
              std::string::npos)
        << bad;
  }
}

// The error names the variable, its range and the value as written.
TEST(CollectiveOptions, RefusesBadValuesNamingTheVariable) {
  const struct {
    std::string CollectiveEnvironment::*field;
    const char* value;
    const char* message;
  } cases[] = {
      {&CollectiveEnvironment::max_blocks, "lots",
       "SYMMPOOL_MAX_BLOCKS must be a whole number from 1 to 65535, got 'lots'"},
      {&CollectiveEnvironment::max_blocks, "0",
       "SYMMPOOL_MAX_BLOCKS must be a whole number from 1 to 65535, got '0'"},
      {&CollectiveEnvironment::max_blocks, "65536",
       "SYMMPOOL_MAX_BLOCKS must be a whole number from 1 to 65535, got '65536'"},
      {&CollectiveEnvironment::max_blocks, "64 ",
       "SYMMPOOL_MAX_BLOCKS must be a whole number from 1 to 65535, got '64 '"},
      {&CollectiveEnvironment::copy_streams, "9",
       "SYMMPOOL_COPY_STREAMS must be a whole number from 1 to 8, got '9'"},
      {&CollectiveEnvironment::barrier_timeout, "0",
       "SYMMPOOL_BARRIER_TIMEOUT must be a whole number from 1 to 86400, got '0'"},
      {&CollectiveEnvironment::barrier_timeout, "1e3",
       "SYMMPOOL_BARRIER_TIMEOUT must be a whole number from 1 to 86400, got '1e3'"},
      {&CollectiveEnvironment::two_step_piece_bytes, "65535",
       "SYMMPOOL_TWO_STEP_PIECE_BYTES must be a whole number from 65536 to 268435456, got '65535'"},
      {&CollectiveEnvironment::two_step_piece_bytes, "1G",
       "SYMMPOOL_TWO_STEP_PIECE_BYTES must be a whole number from 65536 to 268435456, got '1G'"},
      {&CollectiveEnvironment::fused_max_bytes, "-1",
       "SYMMPOOL_FUSED_MAX_BYTES must be a whole number from 0 to 2147483647, got '-1'"},
      {&CollectiveEnvironment::fused_max_bytes, "4G",
       "SYMMPOOL_FUSED_MAX_BYTES must be a whole number from 0 to 2147483647, got '4G'"},
  };
  for (const auto& c : cases) {
    CollectiveEnvironment env;
    env.*c.field = c.value;
    const std::string error = parse_error(env);
    EXPECT_NE(error.find(c.message), std::string::npos) << "value '" << c.value << "': " << error;
  }
}

TEST(CollectiveOptions, CheckRefusesFieldsOutOfRange) {
  EXPECT_NO_THROW(CollectiveOptions{}.check());
  CollectiveOptions options;
  options.max_blocks = 0;
  EXPECT_THROW(options.check(), logic_error);
  options = CollectiveOptions{};
  options.copy_streams = 9;
  EXPECT_THROW(options.check(), logic_error);
  options = CollectiveOptions{};
  options.barrier_timeout = std::chrono::seconds(0);
  EXPECT_THROW(options.check(), logic_error);
  options = CollectiveOptions{};
  options.all_reduce_algorithm = Algorithm::kCopyEnginePush;  // an all-gather's
  EXPECT_THROW(options.check(), logic_error);
  options.all_reduce_algorithm = Algorithm::kLowLatency;
  EXPECT_NO_THROW(options.check());
  options.reduce_scatter_algorithm = Algorithm::kTwoShot;  // an all-reduce's only
  EXPECT_THROW(options.check(), logic_error);
  options.reduce_scatter_algorithm = Algorithm::kTwoStep;
  EXPECT_NO_THROW(options.check());
  options.two_step_piece_bytes = 1 << 10;
  EXPECT_THROW(options.check(), logic_error);
  options = CollectiveOptions{};
  options.fused_max_bytes = std::size_t{1} << 31;
  EXPECT_THROW(options.check(), logic_error);
  options.fused_max_bytes = 0;
  EXPECT_NO_THROW(options.check());
}

// The collectives' knobs are read as written; CollectiveOptions checks them.
TEST(CollectiveOptions, VariablesAreReadAsWritten) {
  const struct {
    const char* variable;
    std::string CollectiveEnvironment::*field;
  } knobs[] = {{"SYMMPOOL_MAX_BLOCKS", &CollectiveEnvironment::max_blocks},
               {"SYMMPOOL_COPY_STREAMS", &CollectiveEnvironment::copy_streams},
               {"SYMMPOOL_BARRIER_TIMEOUT", &CollectiveEnvironment::barrier_timeout},
               {"SYMMPOOL_ALL_REDUCE_ALGORITHM", &CollectiveEnvironment::all_reduce_algorithm},
               {"SYMMPOOL_REDUCE_SCATTER_ALGORITHM", &CollectiveEnvironment::reduce_scatter_algorithm},
               {"SYMMPOOL_TWO_STEP_PIECE_BYTES", &CollectiveEnvironment::two_step_piece_bytes},
               {"SYMMPOOL_FUSED_MAX_BYTES", &CollectiveEnvironment::fused_max_bytes}};
  for (const auto& knob : knobs) {
    ::unsetenv(knob.variable);
    EXPECT_EQ(CollectiveEnvironment::from_process().*knob.field, "") << knob.variable;
    ::setenv(knob.variable, "12", 1);
    EXPECT_EQ(CollectiveEnvironment::from_process().*knob.field, "12") << knob.variable;
    ::unsetenv(knob.variable);
  }
}

}  // namespace symmpool::test
