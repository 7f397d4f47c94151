#include "fake_fixture.hpp"

#include <cstring>
#include <map>
#include <random>

namespace symmpool::test {

class RandomizedTest : public FakeDriverTest {
 protected:
  FakeDeviceConfig config() override {
    FakeDeviceConfig c;
    c.total_memory = std::size_t{8} << 30;  // the live set peaks near 1 GiB
    return c;
  }
};

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
  {
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
  expect_driver_clean();
}

}  // namespace symmpool::test
