#include <symmpool/collective_options.hpp>
#include <symmpool/error.hpp>

#include <exception>
#include <optional>
#include <string>

namespace symmpool {

namespace {

constexpr int kLongestTimeoutSeconds = static_cast<int>(CollectiveOptions::kLongestBarrierTimeout.count());

// A whole number in [lowest, highest] from the environment variable `name`.
int setting(const std::string& text, const char* name, int fallback, int lowest, int highest) {
  if (text.empty()) return fallback;
  std::size_t used = 0;
  long value = 0;
  try {
    value = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  SYMMPOOL_EXPECTS(used == text.size() && value >= lowest && value <= highest,
                   std::string(name) + " must be a whole number from " + std::to_string(lowest) + " to " +
                       std::to_string(highest) + ", got '" + text + "'");
  return static_cast<int>(value);
}

// One of the all-reduce algorithms, by the name to_string gives it.
std::optional<Algorithm> parse_all_reduce_algorithm(const std::string& text) {
  if (text.empty()) return std::nullopt;
  for (int i = 0; i < kAlgorithmCount; ++i) {
    const auto a = static_cast<Algorithm>(i);
    if (runs_all_reduce(a) && text == to_string(a)) return a;
  }
  SYMMPOOL_FAIL("SYMMPOOL_ALL_REDUCE_ALGORITHM must be one-shot, two-shot or low-latency, got '" + text +
                "'");
}

void expect_in_range(long long value, long long lowest, long long highest, const char* field) {
  SYMMPOOL_EXPECTS(value >= lowest && value <= highest, std::string("symmpool: CollectiveOptions::") + field +
                                                            " must be " + std::to_string(lowest) + " to " +
                                                            std::to_string(highest) + ", got " +
                                                            std::to_string(value));
}

}  // namespace

CollectiveOptions CollectiveOptions::from(const Environment& env) {
  CollectiveOptions options;
  options.max_blocks = setting(env.max_blocks, "SYMMPOOL_MAX_BLOCKS", kDefaultMaxBlocks, 1, kLargestGrid);
  options.copy_streams =
      setting(env.copy_streams, "SYMMPOOL_COPY_STREAMS", kDefaultCopyStreams, 1, kMostCopyStreams);
  if (!env.barrier_timeout.empty())
    options.barrier_timeout = std::chrono::seconds(
        setting(env.barrier_timeout, "SYMMPOOL_BARRIER_TIMEOUT", 0, 1, kLongestTimeoutSeconds));
  options.all_reduce_algorithm = parse_all_reduce_algorithm(env.all_reduce_algorithm);
  return options;
}

CollectiveOptions CollectiveOptions::from_environment() { return from(Environment::from_process()); }

void CollectiveOptions::check() const {
  expect_in_range(max_blocks, 1, kLargestGrid, "max_blocks");
  expect_in_range(copy_streams, 1, kMostCopyStreams, "copy_streams");
  if (barrier_timeout)
    expect_in_range(barrier_timeout->count(), 1, kLongestTimeoutSeconds, "barrier_timeout");
  SYMMPOOL_EXPECTS(!all_reduce_algorithm || runs_all_reduce(*all_reduce_algorithm),
                   std::string("symmpool: CollectiveOptions::all_reduce_algorithm cannot be '") +
                       to_string(*all_reduce_algorithm) + "'");
}

}  // namespace symmpool
