#include <symmpool/collective_options.hpp>
#include <symmpool/error.hpp>

#include <exception>
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
  return options;
}

CollectiveOptions CollectiveOptions::from_environment() { return from(Environment::from_process()); }

void CollectiveOptions::check() const {
  expect_in_range(max_blocks, 1, kLargestGrid, "max_blocks");
  expect_in_range(copy_streams, 1, kMostCopyStreams, "copy_streams");
  if (barrier_timeout)
    expect_in_range(barrier_timeout->count(), 1, kLongestTimeoutSeconds, "barrier_timeout");
}

}  // namespace symmpool
