#include "fake_fixture.hpp"

#include <symmpool/error.hpp>

#include <array>
#include <cstring>
#include <map>
#include <ostream>
#include <random>

namespace symmpool::test {

using RandomizedTest = LargeFakeDeviceTest;

struct Live {
  std::size_t size;
  CUstream stream;
  std::uint64_t tag;
};

void write_tag(void* p, std::size_t size, std::uint64_t tag) {
  std::memcpy(p, &tag, std::min(size, sizeof tag));
  if (size >= 2 * sizeof tag) std::memcpy(static_cast<char*>(p) + size - sizeof tag, &tag, sizeof tag);
}

bool tag_intact(const void* p, std::size_t size, std::uint64_t tag) {
  std::uint64_t head = 0, tail = tag;
  std::memcpy(&head, p, std::min(size, sizeof head));
  if (size >= 2 * sizeof tag) std::memcpy(&tail, static_cast<const char*>(p) + size - sizeof tag, sizeof tag);
  std::uint64_t mask = size >= sizeof tag ? ~0ull : (1ull << (8 * size)) - 1;
  return (head & mask) == (tag & mask) && tail == tag;
}

// 100k random allocations and frees over three streams, with record_stream,
// held events and periodic empty_cache: live blocks never overlap, their
// contents survive, and at the end nothing is left anywhere.
TEST_F(RandomizedTest, HundredThousandOperationsLeaveNothingBehind) {
  auto a = make_allocator();
  std::mt19937_64 rng(12345);
  std::map<std::uintptr_t, Live> live;
  auto pick_size = [&]() -> std::size_t {
    std::uint64_t r = rng() % 100;
    if (r < 70) return 1 + rng() % (64 * KiB);
    if (r < 95) return 1 * MiB + rng() % (8 * MiB);
    return 16 * MiB + rng() % (48 * MiB);
  };
  std::uint64_t next_tag = 1;
  for (int op = 0; op < 100000; ++op) {
    const bool do_alloc = live.empty() || (live.size() < 200 && rng() % 2 == 0);
    if (do_alloc) {
      std::size_t size = pick_size();
      CUstream s = stream(1 + static_cast<int>(rng() % 3));
      void* p = a->allocate(size, s);
      auto address = reinterpret_cast<std::uintptr_t>(p);
      auto next = live.lower_bound(address);
      ASSERT_TRUE(next == live.end() || address + size <= next->first) << "overlaps next block";
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.size, address) << "overlaps previous block";
      }
      write_tag(p, size, next_tag);
      live[address] = Live{size, s, next_tag++};
      if (rng() % 10 == 0) a->record_stream(p, stream(1 + static_cast<int>(rng() % 3)));
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng() % live.size()));
      void* p = reinterpret_cast<void*>(it->first);
      ASSERT_TRUE(tag_intact(p, it->second.size, it->second.tag)) << "block contents clobbered";
      a->deallocate(p, it->second.size, it->second.stream);
      live.erase(it);
    }
    if (op % 1000 == 0) fake().hold_events(rng() % 2 == 0);
    if (op % 700 == 0) fake().complete_events();
    if (op % 5000 == 4999) a->empty_cache();
  }
  for (auto& [address, l] : live) a->deallocate(reinterpret_cast<void*>(address), l.size, l.stream);
  fake().complete_events();
  a->empty_cache();
  auto st = a->stats();
  EXPECT_EQ(st.allocated_bytes.current, 0);
  EXPECT_EQ(st.requested_bytes.current, 0);
  EXPECT_EQ(st.active_blocks.current, 0);
  EXPECT_EQ(st.segments.current, 0);
  EXPECT_EQ(st.reserved_bytes.current, 0);
  EXPECT_EQ(st.allocations, st.frees);
  EXPECT_GT(st.cache_hits, st.cache_misses);
  EXPECT_EQ(fake().used_memory(0), 0u);
}

// About 2.5 s in a plain build and 35 s in the Debug ASan/UBSan build of
// scripts/sanitize.sh (measured on a busy 2-core machine), so no scaling down.
constexpr int kPropertyOperations = 1000000;

// What the allocator must agree with: the live allocations and, derived from
// them, the stats. `block` is the rounded size the allocator charged for it.
struct ModelBlock {
  std::size_t size;
  std::size_t block;
  CUstream stream;
  bool other_streams = false;  // record_stream named a stream other than its own
};

using Ranges = std::map<std::uintptr_t, std::size_t>;  // address -> bytes

bool overlaps(const Ranges& ranges, std::uintptr_t address, std::size_t size) {
  auto next = ranges.lower_bound(address);
  if (next != ranges.end() && next->first < address + size) return true;
  return next != ranges.begin() && std::prev(next)->first + std::prev(next)->second > address;
}

// Random operations on one allocator, each checked against the model.
class PropertyRun {
 public:
  PropertyRun(CachingAllocator& a, std::uint64_t seed) : a_(a), seed_(seed), rng_(seed) {}

  // Where a failure happened, so that it reproduces: the seed and the step.
  friend std::ostream& operator<<(std::ostream& os, const PropertyRun& r) {
    return os << " [property test seed " << r.seed_ << ", operation " << r.op_ << "]";
  }

  void step(int op) {
    op_ = op;
    const std::uint64_t r = rng_() % 1000;
    if (live_.empty() || (r < 480 && live_.size() < 200)) {
      allocate();
    } else if (r < 900) {
      free_one();
    } else if (r < 995) {
      record_stream();
    } else if (r < 996) {
      empty_cache();
    } else {
      drive_events();
    }
    if (::testing::Test::HasFatalFailure()) return;
    check_stats(/*with_snapshot=*/op % kSnapshotEvery == 0);
  }

  void finish() {
    while (!live_.empty() && !::testing::Test::HasFatalFailure()) free_at(live_.begin());
    fake().fail("cuEventRecord", CUDA_SUCCESS, 0);  // drop an injected failure not yet hit
    fake().hold_events(false);
    fake().complete_events();
    a_.empty_cache();
    check_stats();
  }

  std::uint64_t event_failures() const { return event_failures_; }

 private:
  static FakeDriver& fake() { return FakeDriver::instance(); }
  CUstream random_stream() { return stream(1 + static_cast<int>(rng_() % 3)); }

  // Mostly small-pool sizes, some mid-size and a few large, with odd sizes.
  std::size_t random_size() {
    const std::uint64_t r = rng_() % 100;
    if (r < 75) return 1 + rng_() % (CachingAllocator::kSmallSize);
    if (r < 97) return CachingAllocator::kSmallSize + 1 + rng_() % (9 * MiB);
    return CachingAllocator::kMinLargeAlloc + rng_() % (40 * MiB);
  }

  void allocate() {
    const std::size_t size = random_size();
    const CUstream s = random_stream();
    // This allocation retries the events that failed to record: held, they
    // keep the block; not held, it may come back at once.
    if (hold_) held_.insert(unrecorded_.begin(), unrecorded_.end());
    unrecorded_.clear();
    const AllocatorStats before = a_.stats();
    void* p = a_.allocate(size, s);
    ASSERT_NE(p, nullptr) << *this;
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    const AllocatorStats after = a_.stats();
    const auto block =
        static_cast<std::size_t>(after.allocated_bytes.current - before.allocated_bytes.current);
    if (after.oom_retries != before.oom_retries) held_.clear();  // it waited for every event
    ASSERT_FALSE(overlaps(held_, address, block)) << "handed out memory that a stream may still use" << *this;
    // The charge is the size rounded to 512 bytes, plus for the large pool a
    // remainder of at most kSmallSize that was not worth splitting off.
    const std::size_t rounded = (size + 511) / 512 * 512;
    const std::size_t slack = rounded <= CachingAllocator::kSmallSize ? 0 : CachingAllocator::kSmallSize;
    ASSERT_GE(block, rounded) << *this;
    ASSERT_LE(block, rounded + slack) << *this;
    ASSERT_EQ(a_.allocation_size(p), size) << *this;
    auto next = live_.lower_bound(address);
    ASSERT_TRUE(next == live_.end() || address + block <= next->first)
        << "overlaps the next live block" << *this;
    if (next != live_.begin()) {
      auto prev = std::prev(next);
      ASSERT_LE(prev->first + prev->second.block, address) << "overlaps the previous live block" << *this;
    }
    live_.emplace(address, ModelBlock{size, block, s});
    allocated_ += block;
    requested_ += size;
  }

  void free_one() {
    auto it = live_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng_() % live_.size()));
    free_at(it);
  }

  // Frees on the block's stream or, one time in four, another one; rarely with
  // a cuEventRecord failure injected (the free must still happen, see
  // FailedEventTest.KeepsTheBlockAndRetries) or followed by a double free.
  void free_at(std::map<std::uintptr_t, ModelBlock>::iterator it) {
    void* p = reinterpret_cast<void*>(it->first);
    const ModelBlock m = it->second;
    const CUstream s = rng_() % 4 == 0 ? random_stream() : m.stream;
    // Fails this free's first or second event, or a later free's.
    if (rng_() % 2000 == 0)
      fake().fail("cuEventRecord", CUDA_ERROR_INVALID_VALUE, 1, static_cast<int>(rng_() % 2));
    try {
      if (rng_() % 2 == 0)
        a_.deallocate(p, m.size, s);
      else
        a_.deallocate(p, s);
      if (hold_ && (m.other_streams || s != m.stream)) held_.emplace(it->first, m.block);
    } catch (const cuda_error&) {
      ++event_failures_;  // reported, and the block is freed all the same
      unrecorded_.emplace(it->first, m.block);
    }
    live_.erase(it);
    allocated_ -= m.block;
    requested_ -= m.size;
    ASSERT_FALSE(a_.is_allocation(p)) << *this;
    if (rng_() % 100 == 0) {
      ASSERT_THROW(a_.deallocate(p, s), logic_error) << *this;
    }
  }

  void record_stream() {
    auto it = live_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng_() % live_.size()));
    const CUstream s = random_stream();
    a_.record_stream(reinterpret_cast<void*>(it->first), s);
    it->second.other_streams |= s != it->second.stream;
  }

  void empty_cache() {
    try {
      a_.empty_cache();
    } catch (const cuda_error&) {
      ++event_failures_;  // an injected event failure hit the retry: nothing changed
    }
    // It waited for every event (or failed first): the model expects no more.
    held_.clear();
    unrecorded_.clear();
  }

  // Holds or releases the fake GPU's events, or completes the pending ones.
  void drive_events() {
    const std::uint64_t r = rng_() % 3;
    if (r < 2) {
      hold_ = r == 0;
      fake().hold_events(hold_);
    } else {
      fake().complete_events();
      held_.clear();  // events not recorded yet stay unrecorded
    }
  }

  // Pools and snapshot are checked every kSnapshotEvery operations and at
  // the end: a snapshot walks every block, which under the sanitizers made
  // the test many times slower when done after every operation.
  static constexpr int kSnapshotEvery = 32;

  void check_stats(bool with_snapshot = true) {
    const AllocatorStats st = a_.stats();
    ASSERT_EQ(st.active_blocks.current, static_cast<std::int64_t>(live_.size())) << *this;
    ASSERT_EQ(st.allocated_bytes.current, static_cast<std::int64_t>(allocated_)) << *this;
    ASSERT_EQ(st.requested_bytes.current, static_cast<std::int64_t>(requested_)) << *this;
    ASSERT_LE(st.allocated_bytes.current, st.reserved_bytes.current) << *this;
    ASSERT_EQ(st.allocations - st.frees, live_.size()) << *this;
    if (with_snapshot) check_pools_and_snapshot(st);
  }

  // The pools add up to the totals (no internal segments here), and the
  // snapshot's segments and blocks add up to both.
  void check_pools_and_snapshot(const AllocatorStats& st) {
    const PoolStats &small = st.small_pool, &large = st.large_pool;
    ASSERT_EQ(small.allocated_bytes.current + large.allocated_bytes.current, st.allocated_bytes.current)
        << *this;
    ASSERT_EQ(small.requested_bytes.current + large.requested_bytes.current, st.requested_bytes.current)
        << *this;
    ASSERT_EQ(small.active_blocks.current + large.active_blocks.current, st.active_blocks.current) << *this;
    ASSERT_EQ(small.reserved_bytes.current + large.reserved_bytes.current, st.reserved_bytes.current)
        << *this;
    ASSERT_EQ(small.segments.current + large.segments.current, st.segments.current) << *this;
    // [small, large]; busy: live or pending (torch's active), split: free in a shared segment.
    std::array<std::int64_t, 2> reserved{}, allocated{}, blocks{}, busy{}, busy_bytes{}, split{},
        split_bytes{};
    for (const SegmentSnapshot& segment : a_.snapshot()) {
      std::uintptr_t next = segment.address;
      for (const BlockSnapshot& b : segment.blocks) {
        ASSERT_EQ(b.address, next) << "blocks must tile their segment " << *this;
        next += b.size;
        const int k = segment.small ? 0 : 1;
        if (b.allocated || b.pending) ++busy[k], busy_bytes[k] += static_cast<std::int64_t>(b.size);
        if (!b.allocated && !b.pending && segment.blocks.size() > 1)
          ++split[k], split_bytes[k] += static_cast<std::int64_t>(b.size);
        if (b.allocated) {
          allocated[segment.small ? 0 : 1] += static_cast<std::int64_t>(b.size);
          ++blocks[segment.small ? 0 : 1];
          ASSERT_TRUE(live_.count(b.address)) << "a live block the model does not know " << *this;
        }
      }
      ASSERT_EQ(next, segment.address + segment.size) << *this;
      reserved[segment.small ? 0 : 1] += static_cast<std::int64_t>(segment.size);
    }
    ASSERT_EQ(reserved,
              (std::array<std::int64_t, 2>{small.reserved_bytes.current, large.reserved_bytes.current}))
        << *this;
    ASSERT_EQ(allocated,
              (std::array<std::int64_t, 2>{small.allocated_bytes.current, large.allocated_bytes.current}))
        << *this;
    ASSERT_EQ(blocks, (std::array<std::int64_t, 2>{small.active_blocks.current, large.active_blocks.current}))
        << *this;
    ASSERT_EQ(busy, (std::array<std::int64_t, 2>{small.busy_blocks.current, large.busy_blocks.current}))
        << *this;
    ASSERT_EQ(busy_bytes, (std::array<std::int64_t, 2>{small.busy_bytes.current, large.busy_bytes.current}))
        << *this;
    ASSERT_EQ(split, (std::array<std::int64_t, 2>{small.inactive_split_blocks.current,
                                                  large.inactive_split_blocks.current}))
        << *this;
    ASSERT_EQ(split_bytes, (std::array<std::int64_t, 2>{small.inactive_split_bytes.current,
                                                        large.inactive_split_bytes.current}))
        << *this;
    ASSERT_EQ(small.busy_blocks.current + large.busy_blocks.current, st.busy_blocks.current) << *this;
    ASSERT_EQ(small.inactive_split_bytes.current + large.inactive_split_bytes.current,
              st.inactive_split_bytes.current)
        << *this;
    ASSERT_GE(st.busy_blocks.peak, st.busy_blocks.current) << *this;
  }

  CachingAllocator& a_;
  const std::uint64_t seed_;
  std::mt19937_64 rng_;
  int op_ = -1;
  std::map<std::uintptr_t, ModelBlock> live_;  // by address
  // Freed blocks that must not be handed out yet: their events are held
  // (until completed), or could not be recorded (until the next retry).
  // A lower bound of what the allocator keeps back, never more.
  bool hold_ = false;
  Ranges held_;
  Ranges unrecorded_;
  std::size_t allocated_ = 0;
  std::size_t requested_ = 0;
  std::uint64_t event_failures_ = 0;
};

// kPropertyOperations random operations against the model: allocations of
// all pools' sizes on three streams, frees on the same or another stream
// (some with an event failure, some followed by a double free), record_stream,
// empty_cache and the fake GPU's events held, released and completed. Live
// blocks never overlap, nor overlap a freed block whose event is still held;
// sizes and stats match. Then everything is freed and nothing is left.
TEST_F(RandomizedTest, OperationsAgreeWithAReferenceModel) {
  constexpr std::uint64_t kSeed = 20240917;
  auto a = make_allocator();
  PropertyRun run(*a, kSeed);
  for (int op = 0; op < kPropertyOperations; ++op) {
    run.step(op);
    ASSERT_FALSE(HasFatalFailure());
  }
  run.finish();
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_GT(run.event_failures(), 0u) << "no injected event failure was exercised";
  const AllocatorStats st = a->stats();
  EXPECT_EQ(st.allocated_bytes.current, 0) << run;
  EXPECT_EQ(st.segments.current, 0) << run;
  EXPECT_EQ(st.reserved_bytes.current, 0) << run;
  EXPECT_EQ(st.allocations, st.frees) << run;
}

}  // namespace symmpool::test
