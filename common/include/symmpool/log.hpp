#pragma once
// Leveled messages to stderr, filtered by subsystem, as NCCL's NCCL_DEBUG
// and NCCL_DEBUG_SUBSYS: SYMMPOOL_DEBUG=NONE|WARN|INFO|TRACE (WARN when
// unset) and SYMMPOOL_DEBUG_SUBSYS=ALLOC,HEAP,COLL,REG,ROUTING,TP,ALL (ALL
// when unset; a leading ^ keeps all but those named). Every line names the
// host, process and thread, the rank where one is known, the level and the
// subsystem. Every stderr write of the library goes through here.

#include <cstdarg>
#include <functional>
#include <string>

namespace symmpool::log {

enum class Level { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

enum Subsys : unsigned {
  kAlloc = 1u << 0,    // the caching allocator, segments, the C ABI
  kHeap = 1u << 1,     // symmetric heaps, peer mappings
  kColl = 1u << 2,     // communicators, failures, watchdogs
  kReg = 1u << 3,      // NCCL registrations and windows
  kRouting = 1u << 4,  // where each collective runs (SYMMPOOL_DEBUG_ROUTING=1 turns it on at INFO too)
  kTp = 1u << 5,       // fused tensor-parallel ops
  kAll = ~0u,
};

// Parses SYMMPOOL_DEBUG's and SYMMPOOL_DEBUG_SUBSYS's values (case does not
// matter); a name it does not know raises symmpool::logic_error naming it.
Level parse_level(const std::string& text);
unsigned parse_subsystems(const std::string& text);

// SYMMPOOL_DEBUG_ROUTING=1 (read now): the routing subsystem at INFO.
bool routing_requested();

// Whether a message of `level` about `subsys` is printed (read once from
// the environment, unless set_filter changed it).
bool enabled(Level level, Subsys subsys);

// printf-style; one line, the prefix added.
void write(Level level, Subsys subsys, const char* format, ...) __attribute__((format(printf, 3, 4)));

// The process's rank for the prefix (the torch bindings set it when a group
// forms; RANK, as torchrun sets it, until then).
void set_rank(int rank);

// Tests: another filter, and where lines go instead of stderr (empty: stderr).
void set_filter(Level level, unsigned subsystems);
void set_sink(std::function<void(const std::string& line)> sink);

}  // namespace symmpool::log

#define SYMMPOOL_LOG(level, subsys, ...)                                                             \
  do {                                                                                               \
    if (::symmpool::log::enabled(level, subsys)) ::symmpool::log::write(level, subsys, __VA_ARGS__); \
  } while (0)
#define SYMMPOOL_WARN(subsys, ...) \
  SYMMPOOL_LOG(::symmpool::log::Level::kWarn, ::symmpool::log::subsys, __VA_ARGS__)
#define SYMMPOOL_INFO(subsys, ...) \
  SYMMPOOL_LOG(::symmpool::log::Level::kInfo, ::symmpool::log::subsys, __VA_ARGS__)
#define SYMMPOOL_TRACE(subsys, ...) \
  SYMMPOOL_LOG(::symmpool::log::Level::kTrace, ::symmpool::log::subsys, __VA_ARGS__)
