#include <symmpool/collective_options.hpp>
#include <symmpool/env_reader.hpp>
#include <symmpool/error.hpp>

#include <exception>
#include <optional>
#include <string>
#include <vector>

namespace symmpool {

namespace {

constexpr int kLongestTimeoutSeconds = static_cast<int>(CollectiveOptions::kLongestBarrierTimeout.count());

// A whole number in [lowest, highest] from the environment variable `name`.
int setting(const std::string& text, const char* name, int fallback, int lowest, int highest) {
  return static_cast<int>(env::whole_number(text, name, fallback, lowest, highest));
}

// "a, b or c": the names to_string gives the algorithms `runs` accepts.
std::string names_of(bool (*runs)(Algorithm)) {
  std::vector<std::string> names;
  for (int i = 0; i < kAlgorithmCount; ++i)
    if (runs(static_cast<Algorithm>(i))) names.push_back(to_string(static_cast<Algorithm>(i)));
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return text;
}

// One of the algorithms `runs` accepts, by the name to_string gives it.
std::optional<Algorithm> parse_algorithm(const std::string& text, const char* name, bool (*runs)(Algorithm)) {
  if (text.empty()) return std::nullopt;
  for (int i = 0; i < kAlgorithmCount; ++i) {
    const auto a = static_cast<Algorithm>(i);
    if (runs(a) && text == to_string(a)) return a;
  }
  SYMMPOOL_FAIL(std::string(name) + " must be " + names_of(runs) + ", got '" + text + "'");
}

void expect_runs(const std::optional<Algorithm>& a, bool (*runs)(Algorithm), const char* field) {
  SYMMPOOL_EXPECTS(!a || runs(*a), std::string("symmpool: CollectiveOptions::") + field + " cannot be '" +
                                       to_string(*a) + "'");
}

void expect_in_range(long long value, long long lowest, long long highest, const char* field) {
  SYMMPOOL_EXPECTS(value >= lowest && value <= highest, std::string("symmpool: CollectiveOptions::") + field +
                                                            " must be " + std::to_string(lowest) + " to " +
                                                            std::to_string(highest) + ", got " +
                                                            std::to_string(value));
}

}  // namespace

CollectiveEnvironment CollectiveEnvironment::from_process() {
  CollectiveEnvironment e;
  e.max_blocks = env::value("SYMMPOOL_MAX_BLOCKS");
  e.copy_streams = env::value("SYMMPOOL_COPY_STREAMS");
  e.barrier_timeout = env::value("SYMMPOOL_BARRIER_TIMEOUT");
  e.all_reduce_algorithm = env::value("SYMMPOOL_ALL_REDUCE_ALGORITHM");
  e.reduce_scatter_algorithm = env::value("SYMMPOOL_REDUCE_SCATTER_ALGORITHM");
  e.two_step_piece_bytes = env::value("SYMMPOOL_TWO_STEP_PIECE_BYTES");
  e.fused_max_bytes = env::value("SYMMPOOL_FUSED_MAX_BYTES");
  return e;
}

CollectiveOptions CollectiveOptions::from(const CollectiveEnvironment& env) {
  CollectiveOptions options;
  options.max_blocks = setting(env.max_blocks, "SYMMPOOL_MAX_BLOCKS", kDefaultMaxBlocks, 1, kLargestGrid);
  options.copy_streams =
      setting(env.copy_streams, "SYMMPOOL_COPY_STREAMS", kDefaultCopyStreams, 1, kMostCopyStreams);
  if (!env.barrier_timeout.empty())
    options.barrier_timeout = std::chrono::seconds(
        setting(env.barrier_timeout, "SYMMPOOL_BARRIER_TIMEOUT", 0, 1, kLongestTimeoutSeconds));
  options.all_reduce_algorithm =
      parse_algorithm(env.all_reduce_algorithm, "SYMMPOOL_ALL_REDUCE_ALGORITHM", runs_all_reduce);
  options.reduce_scatter_algorithm =
      parse_algorithm(env.reduce_scatter_algorithm, "SYMMPOOL_REDUCE_SCATTER_ALGORITHM", runs_reduce_scatter);
  options.two_step_piece_bytes =
      setting(env.two_step_piece_bytes, "SYMMPOOL_TWO_STEP_PIECE_BYTES", kDefaultTwoStepPieceBytes,
              kSmallestTwoStepPieceBytes, kLargestTwoStepPieceBytes);
  if (!env.fused_max_bytes.empty())
    options.fused_max_bytes = static_cast<std::size_t>(setting(
        env.fused_max_bytes, "SYMMPOOL_FUSED_MAX_BYTES", 0, 0, static_cast<int>(kLargestFusedMaxBytes)));
  return options;
}

CollectiveOptions CollectiveOptions::from_environment() {
  return from(CollectiveEnvironment::from_process());
}

void CollectiveOptions::check() const {
  expect_in_range(max_blocks, 1, kLargestGrid, "max_blocks");
  expect_in_range(copy_streams, 1, kMostCopyStreams, "copy_streams");
  if (barrier_timeout)
    expect_in_range(barrier_timeout->count(), 1, kLongestTimeoutSeconds, "barrier_timeout");
  expect_runs(all_reduce_algorithm, runs_all_reduce, "all_reduce_algorithm");
  expect_runs(reduce_scatter_algorithm, runs_reduce_scatter, "reduce_scatter_algorithm");
  expect_in_range(two_step_piece_bytes, kSmallestTwoStepPieceBytes, kLargestTwoStepPieceBytes,
                  "two_step_piece_bytes");
  if (fused_max_bytes)
    expect_in_range(static_cast<long long>(*fused_max_bytes), 0, kLargestFusedMaxBytes, "fused_max_bytes");
}

}  // namespace symmpool
