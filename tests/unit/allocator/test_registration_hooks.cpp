#include "fake_fixture.hpp"

#include <symmpool/error.hpp>
#include <symmpool/nccl_registration.hpp>

#include <algorithm>
#include <stdexcept>

namespace symmpool::test {

using RegistrationHookTest = FakeDriverTest;

ncclComm_t comm(int n) { return reinterpret_cast<ncclComm_t>(static_cast<std::uintptr_t>(n)); }

TEST_F(RegistrationHookTest, RegistersAfterMapAndDeregistersBeforeUnmap) {
  auto a = make_allocator();
  NcclRegistrationHook hook(comm(1), fake().nccl());
  a->add_observer(&hook, true);
  void* p = a->allocate(4096, stream(1));
  a->deallocate(p, stream(1));
  a->empty_cache();
  auto calls = fake().calls();
  std::size_t map = index_of(calls, "cuMemMap");
  std::size_t access = index_of(calls, "cuMemSetAccess");
  std::size_t reg = index_of(calls, "ncclCommRegister");
  std::size_t dereg = index_of(calls, "ncclCommDeregister");
  std::size_t unmap = index_of(calls, "cuMemUnmap");
  ASSERT_LT(unmap, calls.size());
  EXPECT_LT(map, access);
  EXPECT_LT(access, reg);
  EXPECT_LT(reg, dereg);
  EXPECT_LT(dereg, unmap);
  EXPECT_EQ(hook.counts().registrations, 1u);
  EXPECT_EQ(hook.counts().deregistrations, 1u);
  EXPECT_EQ(hook.counts().live, 0u);
  a->remove_observer(&hook, true);
}

TEST_F(RegistrationHookTest, AttachRegistersExistingSegmentsAndDetachDeregisters) {
  auto a = make_allocator();
  void* small = a->allocate(4096, stream(1));
  void* large = a->allocate(30 * MiB, stream(1));
  NcclRegistrationHook hook(comm(1), fake().nccl());
  a->add_observer(&hook, true);
  EXPECT_EQ(hook.counts().registrations, 2u);
  EXPECT_EQ(hook.counts().live_bytes, 2 * MiB + 30 * MiB);
  a->remove_observer(&hook, true);
  EXPECT_EQ(hook.counts().deregistrations, 2u);
  EXPECT_EQ(fake().live_nccl_registrations(), 0u);
  a->deallocate(small, stream(1));
  a->deallocate(large, stream(1));
}

// For an abort: the communicator frees its registrations itself and may be
// stuck on a dead peer, so nothing may call it; later unmaps must not either.
TEST_F(RegistrationHookTest, AbandonedRegistrationsAreNeverDeregistered) {
  auto a = make_allocator();
  void* p = a->allocate(30 * MiB, stream(1));
  NcclRegistrationHook hook(comm(1), fake().nccl());
  a->add_observer(&hook, true);
  EXPECT_EQ(hook.abandon(), 1u);  // still attached, as abort() leaves it until NCCL has aborted
  void* later = a->allocate(40 * MiB, stream(2));
  EXPECT_EQ(hook.counts().registrations, 1u) << "registered with an abandoned communicator";
  a->deallocate(later, stream(2));
  a->deallocate(p, stream(1));
  a->empty_cache();
  a->remove_observer(&hook, /*replay_existing=*/true);
  EXPECT_EQ(fake().count("ncclCommDeregister"), 0u);
  EXPECT_EQ(hook.counts().abandoned, 1u);
  EXPECT_EQ(hook.counts().live, 0u);
  EXPECT_EQ(hook.counts().live_bytes, 0u);
  EXPECT_EQ(hook.abandon(), 0u);
  EXPECT_EQ(fake().live_nccl_registrations(), 1u);  // the communicator's, until its abort
  fake().abort_nccl_communicators();
}

TEST_F(RegistrationHookTest, SteadyStateMakesNoRegistrations) {
  auto a = make_allocator();
  NcclRegistrationHook hook(comm(1), fake().nccl());
  a->add_observer(&hook, true);
  for (int step = 0; step < 1000; ++step) {
    void* x = a->allocate(64 * MiB, stream(1));
    void* y = a->allocate(3 * MiB, stream(1));
    void* z = a->allocate(1000, stream(1));
    a->deallocate(y, stream(1));
    a->deallocate(x, stream(1));
    a->deallocate(z, stream(1));
    if (step == 0) {
      EXPECT_EQ(hook.counts().registrations, 3u);
    }
  }
  EXPECT_EQ(hook.counts().registrations, 3u) << "cached segments must stay registered";
  EXPECT_EQ(fake().count("ncclCommRegister"), 3u);
  a->remove_observer(&hook, true);
}

TEST_F(RegistrationHookTest, EveryAttachedCommunicatorGetsEverySegment) {
  auto a = make_allocator();
  NcclRegistrationHook h1(comm(1), fake().nccl()), h2(comm(2), fake().nccl());
  a->add_observer(&h1, true);
  void* p = a->allocate(4096, stream(1));
  a->add_observer(&h2, true);
  void* q = a->allocate(30 * MiB, stream(1));
  EXPECT_EQ(h1.counts().live, 2u);
  EXPECT_EQ(h2.counts().live, 2u);
  EXPECT_EQ(fake().live_nccl_registrations(), 4u);
  a->remove_observer(&h1, true);
  EXPECT_EQ(fake().live_nccl_registrations(), 2u);
  a->deallocate(p, stream(1));
  a->deallocate(q, stream(1));
  a->empty_cache();
  EXPECT_EQ(h2.counts().live, 0u);
  a->remove_observer(&h2, true);
}

TEST_F(RegistrationHookTest, FailedRegistrationFailsTheAllocationAndLeaksNothing) {
  auto a = make_allocator();
  NcclRegistrationHook h1(comm(1), fake().nccl()), h2(comm(2), fake().nccl());
  a->add_observer(&h1, true);
  a->add_observer(&h2, true);
  fake().fail("ncclCommRegister", ncclUnhandledCudaError, 1, 1);  // h1 succeeds, h2 fails
  EXPECT_THROW(a->allocate(4096, stream(1)), nccl_error);
  EXPECT_EQ(h1.counts().live, 0u) << "h1 must have been told the segment went away";
  EXPECT_EQ(fake().live_nccl_registrations(), 0u);
  EXPECT_EQ(fake().live_handles(), 0u);
  EXPECT_EQ(a->stats().segments.current, 0);
  a->remove_observer(&h1, true);
  a->remove_observer(&h2, true);
}

// A communicator someone else aborted (ProcessGroupNCCL's watchdog, after a
// timeout) is never called again: the next map registers nothing and the
// next unmap deregisters nothing; every registration counts as abandoned.
// Before, the hook called ncclCommRegister/Deregister on the freed communicator.
TEST_F(RegistrationHookTest, ACommunicatorAbortedElsewhereIsLeftAlone) {
  auto a = make_allocator();
  bool usable = true;
  NcclRegistrationHook hook(comm(1), fake().nccl(), [&] { return usable; });
  a->add_observer(&hook, true);
  void* first = a->allocate(30 * MiB, stream(1));
  ASSERT_EQ(hook.counts().live, 1u);
  usable = false;
  fake().abort_nccl_communicators();
  fake().clear_calls();
  void* second = a->allocate(30 * MiB, stream(1));  // a new segment
  a->deallocate(first, stream(1));
  a->deallocate(second, stream(1));
  a->empty_cache();
  EXPECT_EQ(fake().count_prefix("nccl"), 0u);
  EXPECT_EQ(fake().count("cuMemUnmap"), 2u);
  EXPECT_EQ(hook.counts().registrations, 1u);
  EXPECT_EQ(hook.counts().abandoned, 1u);
  EXPECT_EQ(hook.counts().live, 0u);
  a->remove_observer(&hook, true);
  EXPECT_EQ(fake().count_prefix("nccl"), 0u);
}

// A check that throws cannot tell: the communicator is left alone too.
TEST_F(RegistrationHookTest, ACheckThatThrowsCountsAsAborted) {
  auto a = make_allocator();
  NcclRegistrationHook hook(comm(1), fake().nccl(), []() -> bool { throw std::runtime_error("no answer"); });
  a->add_observer(&hook, true);
  a->deallocate(a->allocate(30 * MiB, stream(1)), stream(1));
  a->empty_cache();
  EXPECT_EQ(fake().count_prefix("nccl"), 0u);
  EXPECT_EQ(hook.counts().registrations, 0u);
  a->remove_observer(&hook, true);
}

TEST_F(RegistrationHookTest, AttachingTwiceIsAnError) {
  auto a = make_allocator();
  NcclRegistrationHook hook(comm(1), fake().nccl());
  a->add_observer(&hook, true);
  EXPECT_THROW(a->add_observer(&hook, true), logic_error);
  EXPECT_THROW(NcclRegistrationHook(nullptr, fake().nccl()), logic_error);
  a->remove_observer(&hook, true);
}

}  // namespace symmpool::test
