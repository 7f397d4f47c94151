// Replays an allocation trace recorded on a GPU (bench/allocator_workload.py
// --record-trace) through symmpool's caching allocator on the fake driver,
// so that allocator policies can be compared on any machine, and prints what
// the device would have held: peak reserved and allocated bytes beside the
// peak reserved by the allocator that recorded the trace.
//
//   symmpool_allocator_replay TRACE [--device-gib N] [--no-segment-moves]
//   zcat TRACE.gz | symmpool_allocator_replay - ...
//
// TRACE, one event a line ('#' starts a comment):
//   a <id> <bytes> <stream>   an allocation (id: the recording's address)
//   f <id>                    its free (stream order, on its own stream)
//   s <bytes> / S <bytes>     the recorder's allocator mapped / released a segment

#include <symmpool/caching_allocator.hpp>
#include <symmpool/environment.hpp>
#include <symmpool/segment_arena.hpp>
#include <symmpool/testing/fake_driver.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace {

using symmpool::CachingAllocator;

struct Options {
  std::string trace;
  std::size_t device_bytes = std::size_t{141} << 30;  // an H200's
  bool segment_moves = true;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device-gib" && i + 1 < argc)
      o.device_bytes = static_cast<std::size_t>(std::stoull(argv[++i])) << 30;
    else if (arg == "--no-segment-moves")
      o.segment_moves = false;
    else if ((arg == "-" || (!arg.empty() && arg[0] != '-')) && o.trace.empty())
      o.trace = arg;
    else
      throw std::invalid_argument("unknown argument '" + arg + "'");
  }
  if (o.trace.empty())
    throw std::invalid_argument(
        "usage: symmpool_allocator_replay TRACE [--device-gib N] [--no-segment-moves]");
  return o;
}

CUstream fake_stream(std::uint64_t recorded, std::map<std::uint64_t, CUstream>& streams) {
  // The fake driver takes any handle as a stream: 1, 2, ... in order of appearance.
  auto [it, added] = streams.try_emplace(recorded, nullptr);
  if (added) it->second = reinterpret_cast<CUstream>(static_cast<std::uintptr_t>(streams.size()));
  return it->second;
}

struct Live {
  void* ptr;
  CUstream stream;
};

int replay(const Options& o) {
  std::ifstream file;
  if (o.trace != "-") {
    file.open(o.trace);
    if (!file) throw std::runtime_error("cannot read " + o.trace);
  }
  std::istream& in = o.trace == "-" ? std::cin : file;
  symmpool::testing::FakeDeviceConfig config;
  config.total_memory = o.device_bytes;
  auto& fake = symmpool::testing::FakeDriver::instance();
  fake.reset(1, config);
  symmpool::Environment env;
  env.segment_moves = o.segment_moves;
  symmpool::ArenaOptions arena_options;
  arena_options.env = env;
  std::unordered_map<std::uint64_t, Live> live;
  std::map<std::uint64_t, CUstream> streams;
  std::int64_t recorded_reserved = 0, recorded_peak = 0;
  std::uint64_t events = 0, line_number = 0;
  {
    CachingAllocator allocator(std::make_unique<symmpool::SegmentArena>(fake.api(), 0, arena_options),
                               env.segment_moves);
    std::string line;
    while (std::getline(in, line)) {
      ++line_number;
      if (line.empty() || line[0] == '#') continue;
      std::istringstream fields(line);
      char kind = 0;
      fields >> kind;
      auto bad = [&] {
        return std::runtime_error(o.trace + ":" + std::to_string(line_number) + ": cannot read '" + line +
                                  "'");
      };
      if (kind == 'a') {
        std::uint64_t id = 0, bytes = 0, stream = 0;
        if (!(fields >> id >> bytes >> stream)) throw bad();
        const CUstream s = fake_stream(stream, streams);
        if (!live.emplace(id, Live{allocator.allocate(bytes, s), s}).second)
          throw std::runtime_error(o.trace + ":" + std::to_string(line_number) + ": id " +
                                   std::to_string(id) + " allocated twice");
      } else if (kind == 'f') {
        std::uint64_t id = 0;
        if (!(fields >> id)) throw bad();
        auto it = live.find(id);
        if (it == live.end()) continue;  // allocated before the recording began
        allocator.deallocate(it->second.ptr, it->second.stream);
        live.erase(it);
      } else if (kind == 's' || kind == 'S') {
        std::int64_t bytes = 0;
        if (!(fields >> bytes)) throw bad();
        recorded_reserved += kind == 's' ? bytes : -bytes;
        recorded_peak = std::max(recorded_peak, recorded_reserved);
      } else {
        throw bad();
      }
      ++events;
    }
    const auto stats = allocator.stats();
    std::printf(
        "{\"trace\": \"%s\", \"events\": %llu, \"segment_moves\": %s, \"peak_reserved_bytes\": %lld, "
        "\"peak_allocated_bytes\": %lld, \"segment_maps\": %llu, \"outgrown_segment_releases\": %llu, "
        "\"recorded_peak_reserved_bytes\": %lld}\n",
        o.trace.c_str(), static_cast<unsigned long long>(events), o.segment_moves ? "true" : "false",
        static_cast<long long>(stats.reserved_bytes.peak), static_cast<long long>(stats.allocated_bytes.peak),
        static_cast<unsigned long long>(stats.segment_maps),
        static_cast<unsigned long long>(stats.outgrown_segment_releases),
        static_cast<long long>(recorded_peak));
    for (auto& [id, block] : live) allocator.deallocate(block.ptr, block.stream);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return replay(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "symmpool_allocator_replay: %s\n", e.what());
    return 1;
  }
}
