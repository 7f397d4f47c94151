#include <symmpool/env_reader.hpp>
#include <symmpool/error.hpp>
#include <symmpool/log.hpp>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace symmpool::log {

namespace {

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

struct Filter {
  std::atomic<int> level;
  std::atomic<unsigned> subsystems;
};

}  // namespace

bool routing_requested() { return env::is_true("SYMMPOOL_DEBUG_ROUTING"); }

namespace {

// Read once; a value the parser refuses is said once and the default kept
// (no exception may leave a logging call).
Filter& filter() {
  static Filter* f = [] {
    auto* made = new Filter;  // never destroyed: messages may come during static destruction
    // The logger's own settings: SYMMPOOL_DEBUG, SYMMPOOL_DEBUG_SUBSYS, SYMMPOOL_DEBUG_ROUTING.
    const std::string debug_level = env::value("SYMMPOOL_DEBUG");
    const std::string debug_subsystems = env::value("SYMMPOOL_DEBUG_SUBSYS");
    Level level = Level::kWarn;
    unsigned subsystems = kAll;
    try {
      if (!debug_level.empty()) level = parse_level(debug_level);
      if (!debug_subsystems.empty()) subsystems = parse_subsystems(debug_subsystems);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "symmpool WARN %s; using SYMMPOOL_DEBUG=WARN, every subsystem\n", e.what());
    }
    if (routing_requested() && level < Level::kInfo) {
      // SYMMPOOL_DEBUG_ROUTING=1: the routing subsystem at INFO, the others as they were.
      level = Level::kInfo;
      subsystems = debug_level.empty() ? static_cast<unsigned>(kRouting) : (subsystems | kRouting);
    }
    made->level = static_cast<int>(level);
    made->subsystems = subsystems;
    return made;
  }();
  return *f;
}

std::atomic<int> process_rank{-1};

std::mutex& sink_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

std::function<void(const std::string&)>& sink() {
  static auto* s = new std::function<void(const std::string&)>;
  return *s;
}

const char* level_name(Level level) {
  return level == Level::kWarn ? "WARN" : level == Level::kInfo ? "INFO" : "TRACE";
}

const char* subsystem_name(Subsys subsys) {
  switch (subsys) {
    case kAlloc:
      return "ALLOC";
    case kHeap:
      return "HEAP";
    case kColl:
      return "COLL";
    case kReg:
      return "REG";
    case kRouting:
      return "ROUTING";
    case kTp:
      return "TP";
    default:
      return "ALL";
  }
}

int rank_for_prefix() {
  const int set = process_rank.load(std::memory_order_relaxed);
  if (set >= 0) return set;
  static const int from_env = [] {
    const char* rank = std::getenv("RANK");  // torchrun's
    return rank && *rank ? std::atoi(rank) : -1;
  }();
  return from_env;
}

}  // namespace

Level parse_level(const std::string& text) {
  const std::string name = upper(text);
  if (name == "NONE") return Level::kNone;
  if (name == "WARN") return Level::kWarn;
  if (name == "INFO") return Level::kInfo;
  if (name == "TRACE") return Level::kTrace;
  throw logic_error("SYMMPOOL_DEBUG='" + text + "' is not one of NONE, WARN, INFO, TRACE");
}

unsigned parse_subsystems(const std::string& text) {
  std::string names = upper(text);
  const bool all_but = !names.empty() && names[0] == '^';
  if (all_but) names.erase(0, 1);
  unsigned mask = 0;
  std::size_t start = 0;
  while (start <= names.size()) {
    const std::size_t end = std::min(names.find(',', start), names.size());
    const std::string name = names.substr(start, end - start);
    start = end + 1;
    if (name.empty()) continue;
    static const std::pair<const char*, unsigned> known[] = {
        {"ALLOC", kAlloc},     {"HEAP", kHeap}, {"COLL", kColl}, {"REG", kReg},
        {"ROUTING", kRouting}, {"TP", kTp},     {"ALL", kAll}};
    auto it =
        std::find_if(std::begin(known), std::end(known), [&](const auto& k) { return name == k.first; });
    if (it == std::end(known))
      throw logic_error("SYMMPOOL_DEBUG_SUBSYS names '" + name +
                        "', not one of ALLOC, HEAP, COLL, REG, ROUTING, TP, ALL");
    mask |= it->second;
  }
  return all_but ? ~mask : mask;
}

bool enabled(Level level, Subsys subsys) {
  const Filter& f = filter();
  return static_cast<int>(level) <= f.level.load(std::memory_order_relaxed) &&
         (f.subsystems.load(std::memory_order_relaxed) & subsys) != 0;
}

void write(Level level, Subsys subsys, const char* format, ...) {
  char message[2048];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  char host[64] = "?";
  gethostname(host, sizeof(host) - 1);
  char rank[24] = "";
  if (const int r = rank_for_prefix(); r >= 0) std::snprintf(rank, sizeof(rank), " [rank %d]", r);
  char line[2304];
  std::snprintf(line, sizeof(line), "%s:%d:%ld%s symmpool %s %s %s", host, static_cast<int>(getpid()),
                static_cast<long>(syscall(SYS_gettid)), rank, level_name(level), subsystem_name(subsys),
                message);
  std::lock_guard<std::mutex> lock(sink_mutex());
  if (sink()) {
    sink()(line);
    return;
  }
  std::fprintf(stderr, "%s\n", line);
}

void set_rank(int rank) { process_rank.store(rank, std::memory_order_relaxed); }

void set_filter(Level level, unsigned subsystems) {
  Filter& f = filter();
  f.level = static_cast<int>(level);
  f.subsystems = subsystems;
}

void set_sink(std::function<void(const std::string& line)> new_sink) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  sink() = std::move(new_sink);
}

}  // namespace symmpool::log
