// Rendezvoused ranges on the fake driver: a range counts only while the
// allocation that held it at its rendezvous lives, so a buffer freed and
// allocated again at the same address is never read at stale peer bytes.

#include "fake_fixture.hpp"

#include <symmpool/error.hpp>
#include <symmpool/rendezvous_registry.hpp>

namespace symmpool::test {

using RendezvousRegistryTest = FakeDriverTest;

TEST_F(RendezvousRegistryTest, RangesCountWhileTheirAllocationLives) {
  auto alloc = make_allocator();
  RendezvousRegistry registry(*alloc);
  char* a = static_cast<char*>(alloc->allocate(4096, stream(1)));
  expect_error<logic_error>([&] { registry.add(a, 4097); }, "not inside one live symmpool allocation");
  EXPECT_NE(registry.why_not_covered(a, 16), "");

  registry.add(a, 1024);
  EXPECT_EQ(registry.why_not_covered(a + 512, 512), "");
  EXPECT_NE(registry.why_not_covered(a + 512, 513).find("were not rendezvoused"), std::string::npos);
  registry.add(a, 4096);  // the same buffer again, wider
  EXPECT_EQ(registry.why_not_covered(a + 512, 2048), "");
  EXPECT_EQ(registry.size(), 1u);

  alloc->deallocate(a, stream(1));
  char* b = static_cast<char*>(alloc->allocate(4096, stream(1)));
  ASSERT_EQ(b, a) << "the cache should hand the same block back";
  EXPECT_NE(registry.why_not_covered(b, 16).find("was freed since"), std::string::npos)
      << "a new buffer at a rendezvoused address must not count as rendezvoused";

  registry.add(b, 2048);
  EXPECT_EQ(registry.why_not_covered(b, 2048), "");
  EXPECT_NE(registry.why_not_covered(b, 4096), "") << "the old, wider range belonged to the freed buffer";
  alloc->deallocate(b, stream(1));
}

TEST_F(RendezvousRegistryTest, FreedRangesArePrunedAtTheNextRendezvous) {
  auto alloc = make_allocator();
  RendezvousRegistry registry(*alloc);
  for (int i = 0; i < 50; ++i) {
    void* p = alloc->allocate(1000 + static_cast<std::size_t>(i) * 512, stream(1));
    registry.add(p, 1000);
    alloc->deallocate(p, stream(1));
  }
  EXPECT_EQ(registry.size(), 1u) << "ranges of freed buffers were kept";
  void* kept = alloc->allocate(4096, stream(1));
  registry.add(kept, 4096);
  EXPECT_EQ(registry.size(), 1u);
  alloc->deallocate(kept, stream(1));
}

}  // namespace symmpool::test
