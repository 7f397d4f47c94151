#include <symmpool/collective_routing.hpp>
#include <symmpool/log.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

namespace symmpool::test {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr RoutingSettings kTable{};                         // SYMMPOOL_COLLECTIVES unset
constexpr RoutingSettings kAlways{true, true};              // =always
constexpr RoutingSettings kDisabled{false, false};          // =0
constexpr RoutingSettings kNcclWindows{true, false, true};  // =nccl-windows

// A call symmpool takes at 2 ranks: `count` bf16 elements per rank.
CollectiveCall call_of(CollectiveKind kind, std::int64_t count = 1024, int world = 2) {
  CollectiveCall c;
  c.kind = kind;
  c.world = world;
  c.element_size = 2;
  c.input_numel = kind == CollectiveKind::kReduceScatter ? count * world : count;
  c.output_numel = kind == CollectiveKind::kAllGather ? count * world : count;
  return c;
}

constexpr CollectiveKind kKinds[] = {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                                     CollectiveKind::kAllReduce};

void expect_nccl(const CollectiveCall& c, RouteReason reason, RoutingSettings settings = kAlways) {
  const RouteDecision d = route_by_shape(c, settings);
  EXPECT_EQ(d.engine, Engine::kNccl) << to_string(c.kind);
  EXPECT_EQ(d.reason, reason) << to_string(c.kind) << ": " << to_string(d.reason);
}

TEST(CollectiveRouting, EligibleCallsFollowTheTableOrAlways) {
  for (CollectiveKind kind : kKinds) {
    const RouteDecision table = route_by_shape(call_of(kind), kTable);
    EXPECT_EQ(table.engine, Engine::kSymmpool);
    EXPECT_EQ(table.reason, RouteReason::kTablePrefersSymmpool);
    const RouteDecision always = route_by_shape(call_of(kind), kAlways);
    EXPECT_EQ(always.engine, Engine::kSymmpool);
    EXPECT_EQ(always.reason, RouteReason::kCollectivesAlways);
  }
}

TEST(CollectiveRouting, TheTableSeesTheBytesItWasMeasuredOn) {
  // all_reduce: symmpool up to 16 MiB at 4 ranks (bf16: 8 Mi elements).
  const auto at_limit = call_of(CollectiveKind::kAllReduce, 8 * MiB, 4);
  EXPECT_EQ(table_bytes(at_limit), 16 * MiB);
  EXPECT_EQ(route_by_shape(at_limit, kTable).reason, RouteReason::kTablePrefersSymmpool);
  expect_nccl(call_of(CollectiveKind::kAllReduce, 8 * MiB + 1, 4), RouteReason::kTablePrefersNccl, kTable);
  EXPECT_EQ(route_by_shape(call_of(CollectiveKind::kAllReduce, 8 * MiB + 1, 4), kAlways).engine,
            Engine::kSymmpool);
  // all_gather: the output; reduce_scatter: the input.
  EXPECT_EQ(table_bytes(call_of(CollectiveKind::kAllGather, 100, 4)), 800u);
  EXPECT_EQ(table_bytes(call_of(CollectiveKind::kReduceScatter, 100, 4)), 800u);
  // World sizes the table has no measurements for.
  for (CollectiveKind kind : kKinds)
    expect_nccl(call_of(kind, 1024, 3), RouteReason::kTablePrefersNccl, kTable);
}

TEST(CollectiveRouting, EachIneligibleCallSaysWhy) {
  for (CollectiveKind kind : kKinds) {
    expect_nccl(call_of(kind), RouteReason::kCollectivesDisabled, kDisabled);
    auto c = call_of(kind);
    c.on_cuda = false;
    expect_nccl(c, RouteReason::kNotCuda);
    expect_nccl(call_of(kind, 1024, 9), RouteReason::kTooManyRanks);
    c = call_of(kind);
    c.same_dtype = false;
    expect_nccl(c, RouteReason::kDtypesDiffer);
    c = call_of(kind);
    c.contiguous = false;
    expect_nccl(c, RouteReason::kNotContiguous);
    c = call_of(kind);
    c.output_numel += 1;
    expect_nccl(c, RouteReason::kSizesDoNotMatch);
    c = call_of(kind);
    c.input_numel += 1;
    expect_nccl(c, RouteReason::kSizesDoNotMatch);
    expect_nccl(call_of(kind, 0), RouteReason::kEmpty);
  }
  for (CollectiveKind kind : {CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce}) {
    auto c = call_of(kind);
    c.dtype_supported = false;
    expect_nccl(c, RouteReason::kDtypeNotSupported);
    c = call_of(kind);
    c.reduce_op_supported = false;
    expect_nccl(c, RouteReason::kReduceOpNotSupported);
  }
}

TEST(CollectiveRouting, AllGatherCopiesAnyDtypeAndHasNoReduceOp) {
  auto c = call_of(CollectiveKind::kAllGather);
  c.dtype_supported = false;
  c.reduce_op_supported = false;
  EXPECT_EQ(route_by_shape(c, kAlways).engine, Engine::kSymmpool);
}

TEST(CollectiveRouting, ReasonsAreDistinctAndSayWhoCountsThem) {
  std::set<std::string> texts;
  int routed = 0, fallbacks = 0;
  for (int r = 0; r < kRouteReasons; ++r) {
    const auto reason = static_cast<RouteReason>(r);
    texts.insert(to_string(reason));
    EXPECT_FALSE(runs_on_symmpool(reason) && is_nccl_fallback(reason)) << to_string(reason);
    routed += runs_on_symmpool(reason);
    fallbacks += is_nccl_fallback(reason);
  }
  EXPECT_EQ(texts.size(), std::size_t(kRouteReasons));
  EXPECT_EQ(texts.count("unknown"), 0u);
  EXPECT_EQ(routed, 2);
  EXPECT_EQ(fallbacks, 4);  // group spans nodes, buffer not in heap, not symmetric, no NCCL windows
  EXPECT_FALSE(runs_on_symmpool(RouteReason::kCollectivesNcclWindows));
  EXPECT_FALSE(runs_on_symmpool(RouteReason::kTablePrefersNcclWindows));
  EXPECT_TRUE(is_nccl_fallback(RouteReason::kNotInHeap));
  EXPECT_FALSE(is_nccl_fallback(RouteReason::kTablePrefersNccl));
}

TEST(CollectiveRouting, DebugRoutingIsReadFromTheEnvironment) {
  ::unsetenv("SYMMPOOL_DEBUG_ROUTING");
  EXPECT_FALSE(log::routing_requested());
  ::setenv("SYMMPOOL_DEBUG_ROUTING", "1", 1);
  EXPECT_TRUE(log::routing_requested());
  ::setenv("SYMMPOOL_DEBUG_ROUTING", "0", 1);
  EXPECT_FALSE(log::routing_requested());
  ::unsetenv("SYMMPOOL_DEBUG_ROUTING");
}

// What the ranks compare when their group forms: the variable as it would be set.
TEST(CollectiveRouting, SettingsReadAsTheVariableWouldBeSet) {
  EXPECT_STREQ(to_string(RoutingSettings{}), "table");
  EXPECT_STREQ(to_string(RoutingSettings{true, true}), "always");
  EXPECT_STREQ(to_string(RoutingSettings{false, false}), "0");
  EXPECT_STREQ(to_string(RoutingSettings{false, true}), "0");  // disabled wins, as route_by_shape
  EXPECT_STREQ(to_string(kNcclWindows), "nccl-windows");
  EXPECT_STREQ(to_string(RoutingSettings{false, false, true}), "0");
}

// SYMMPOOL_COLLECTIVES=nccl-windows: every call symmpool could take goes to
// NCCL's windows (the router then checks the buffers); the others say why not.
TEST(CollectiveRouting, NcclWindowsTakesEveryEligibleCall) {
  for (CollectiveKind kind : kKinds) {
    for (int world : {1, 2, 8}) {
      const RouteDecision d = route_by_shape(call_of(kind, 1024, world), kNcclWindows);
      EXPECT_EQ(d.engine, Engine::kNcclWindows) << world;
      EXPECT_EQ(d.reason, RouteReason::kCollectivesNcclWindows);
    }
    expect_nccl(call_of(kind, 0), RouteReason::kEmpty, kNcclWindows);
    auto c = call_of(kind);
    c.contiguous = false;
    expect_nccl(c, RouteReason::kNotContiguous, kNcclWindows);
  }
}

TEST(CollectiveRouting, SettingsAreReadFromTheEnvironment) {
  ::unsetenv("SYMMPOOL_COLLECTIVES");
  EXPECT_TRUE(RoutingSettings::from_process().enabled);  // where the table says so
  EXPECT_FALSE(RoutingSettings::from_process().always);
  ::setenv("SYMMPOOL_COLLECTIVES", "0", 1);
  EXPECT_FALSE(RoutingSettings::from_process().enabled);
  ::setenv("SYMMPOOL_COLLECTIVES", "1", 1);
  EXPECT_TRUE(RoutingSettings::from_process().enabled);
  EXPECT_FALSE(RoutingSettings::from_process().always);
  ::setenv("SYMMPOOL_COLLECTIVES", "Always", 1);
  EXPECT_TRUE(RoutingSettings::from_process().enabled);
  EXPECT_TRUE(RoutingSettings::from_process().always);
  ::setenv("SYMMPOOL_COLLECTIVES", "nccl-windows", 1);
  EXPECT_TRUE(RoutingSettings::from_process().nccl_windows);
  EXPECT_FALSE(RoutingSettings::from_process().always);
  ::unsetenv("SYMMPOOL_COLLECTIVES");
  EXPECT_FALSE(RoutingSettings::from_process().nccl_windows);
  EXPECT_TRUE(nccl_windows_from_process());  // on unless turned off
  ::setenv("SYMMPOOL_NCCL_WINDOWS", "0", 1);
  EXPECT_FALSE(nccl_windows_from_process());
  ::unsetenv("SYMMPOOL_NCCL_WINDOWS");
}

}  // namespace symmpool::test
