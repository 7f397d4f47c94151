// How symmpool's collectives fail when the group is broken: a peer that
// stops coming times out with an error naming it (and work queued behind
// drains without touching its peers; a rank later than the timeout fails
// too; a graph replayed beside the failed call ends only once the failure
// is on record), ranks whose calls
// differ (or whose buffers lie at other offsets) fail instead of pairing
// them, a communicator that fails to form leaves nothing behind, and ranks
// that share a GPU are refused when their heap forms; and what must not
// fail: a rank that allocated alone keeps working with its peers.

#include "process_group.hpp"
#include "rank_checks.hpp"

#include <symmpool/algorithm_table.hpp>
#include <symmpool/communicator.hpp>
#include <symmpool/device_allocators.hpp>
#include <symmpool/error.hpp>
#include <symmpool/symmetric_group.hpp>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace symmpool::test {

namespace {

constexpr int kTimeout = 10;  // seconds: every barrier's and heap exchange's patience here

// SYMMPOOL_BARRIER_TIMEOUT=kTimeout for the ranks a test forks, unset when it ends.
class BarrierTimeout {
 public:
  BarrierTimeout() { ::setenv("SYMMPOOL_BARRIER_TIMEOUT", std::to_string(kTimeout).c_str(), 1); }
  ~BarrierTimeout() { ::unsetenv("SYMMPOOL_BARRIER_TIMEOUT"); }
  BarrierTimeout(const BarrierTimeout&) = delete;
  BarrierTimeout& operator=(const BarrierTimeout&) = delete;
};

// A group whose heap exchanges also give up after kTimeout (an exchange by
// mistake fails as soon as a barrier would), with `on_failure` (silent when
// empty); with `bracketed`, reductions reading over 1 MiB from each peer run
// between barrier kernels (SYMMPOOL_FUSED_MAX_BYTES), where at 2 ranks the
// table has every size meet inside one kernel.
SymmetricGroupOptions group_options(FailureHandler on_failure = {}, bool bracketed = false) {
  SymmetricGroupOptions options;
  options.heap_timeout = std::chrono::seconds(kTimeout);
  options.on_failure = on_failure ? std::move(on_failure) : [](const std::string&) {};
  if (bracketed) {
    options.collectives = CollectiveOptions::from_environment();  // keeps SYMMPOOL_BARRIER_TIMEOUT
    options.collectives->fused_max_bytes = std::size_t{1} << 20;
  }
  return options;
}

// The ways two-shot meets its peers: inside one fused kernel (small calls,
// and at 2 ranks every size: a large one has the most meeting blocks), or
// around its reduction with two barrier kernels (chunks over
// fused_kernel_limit: 1 MiB at 3 ranks and more; at 2, a group made so).
struct TwoShotCase {
  const char* name;
  std::size_t bytes;
  bool bracketed;  // the group's reductions over 1 MiB a peer run between barrier kernels
  // The case's call: an in-place two-shot sum of its bytes of floats.
  void all_reduce(Communicator& comm, void* buffer, cudaStream_t s) const {
    comm.all_reduce(buffer, buffer, bytes / 4, DataType::kFloat32, ReduceOp::kSum, s, Algorithm::kTwoShot);
  }
};
constexpr std::size_t kTwoShotLarge = std::size_t{64} << 20;
static_assert(fused_kernel(kTwoShotLarge / 2, 2) && !fused_kernel(kTwoShotLarge / 3, 3),
              "by the table, the large case meets inside at 2 ranks and between barriers at more");
constexpr TwoShotCase kTwoShotCases[] = {
    {"two-shot all-reduce, one fused kernel", 16384, false},
    {"large two-shot all-reduce, as the table runs it", kTwoShotLarge, false},
    {"two-shot all-reduce between barriers", kTwoShotLarge, true}};
constexpr int kTwoShotCaseCount = sizeof(kTwoShotCases) / sizeof(kTwoShotCases[0]);

// What every rank of these tests sets up first: its GPU current, the
// shared store, that GPU's allocator and a stream of its own. Throws where
// CUDA refuses (the rank then fails, printing why).
struct RankSetup {
  explicit RankSetup(int rank)
      : device(current(device_of_rank(rank))), store(shared_store_dir()), alloc(device_allocator(device)) {
    if (cudaStreamCreate(&s) != cudaSuccess) throw std::runtime_error("cudaStreamCreate failed");
  }
  // A group for each of kTwoShotCases, named <prefix>0, <prefix>1, ...:
  // all formed before any is used.
  std::vector<std::unique_ptr<SymmetricGroup>> two_shot_groups(const std::string& prefix, int rank,
                                                               int world) {
    std::vector<std::unique_ptr<SymmetricGroup>> formed;
    for (int g = 0; g < kTwoShotCaseCount; ++g)
      formed.push_back(std::make_unique<SymmetricGroup>(real_driver(), alloc, store,
                                                        prefix + std::to_string(g), rank, world,
                                                        group_options({}, kTwoShotCases[g].bracketed)));
    return formed;
  }
  // `bytes` of the allocator's memory, zeroed on the stream.
  char* zeroed(std::size_t bytes) {
    void* p = alloc.allocate(bytes, reinterpret_cast<CUstream>(s));
    if (cudaMemsetAsync(p, 0, bytes, s) != cudaSuccess) throw std::runtime_error("cudaMemsetAsync failed");
    return static_cast<char*>(p);
  }

  int device;
  FileStore store;
  CachingAllocator& alloc;
  cudaStream_t s = nullptr;

 private:
  static int current(int device) {
    if (cudaSetDevice(device) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
    return device;
  }
};

// What `calls` raised once `s` drained (empty: nothing), and after how long.
struct Raised {
  std::string what;
  double seconds = 0;
};
Raised raised_by(Communicator& comm, cudaStream_t s, const std::function<void()>& calls) {
  const auto start = std::chrono::steady_clock::now();
  Raised r;
  try {
    calls();
    const cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) r.what = std::string("cudaStreamSynchronize: ") + cudaGetErrorString(e);
    comm.check_errors();
  } catch (const collective_error& e) {
    r.what = e.what();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

// A collective call of the tests below on a communicator and a buffer.
using BufferCall = std::function<void(Communicator&, char*)>;

// One case of the tests of buffers at other offsets, in a group of its own
// named `group`: `warm` runs alike on both ranks on buffers a and b (every
// verdict cached from then on), then rank 0 runs `raise` on b where rank 1
// runs it on a. What that raised; throws where the warm-up fails.
Raised raised_at_other_offsets(RankSetup& setup, int rank, int world, const std::string& group,
                               bool bracketed, char* a, char* b, const BufferCall& warm,
                               const BufferCall& raise) {
  SymmetricGroup formed(real_driver(), setup.alloc, setup.store, group, rank, world,
                        group_options({}, bracketed));
  Communicator& comm = formed.communicator();
  for (char* x : {a, b}) warm(comm, x);
  const cudaError_t e = cudaStreamSynchronize(setup.s);
  if (e != cudaSuccess) throw std::runtime_error(std::string("warm-up: ") + cudaGetErrorString(e));
  comm.check_errors();
  return raised_by(comm, setup.s, [&] { raise(comm, rank == 0 ? b : a); });
}

// Prints what `name` raised on `rank` and counts what is amiss: nothing
// raised (the calls went through), no `expected` in the error, or raised
// only after `at_most_s`.
int failures_of(int rank, const char* name, const Raised& raised, const std::string& expected,
                double at_most_s) {
  int failures = 0;
  std::printf("[rank %d] %s: raised after %.1f s: %s\n", rank, name, raised.seconds, raised.what.c_str());
  RANK_EXPECT(!raised.what.empty(), "%s: the calls went through", name);
  RANK_EXPECT(raised.what.find(expected) != std::string::npos, "%s: expected '%s' in: %s", name,
              expected.c_str(), raised.what.c_str());
  RANK_EXPECT(raised.seconds < at_most_s, "%s: raised after %.1f s", name, raised.seconds);
  return failures;
}

// Two ranks: rank r's `in` is filled with r + 1 and all-reduced into `out`
// (poisoned first where it is another buffer); counts the failures: sums
// that are not 3 (`when` says which call), CUDA calls that failed.
int failures_of_summing(Communicator& comm, cudaStream_t s, float* in, float* out, std::size_t count,
                        int rank, Algorithm algorithm, const char* when) {
  int failures = 0;
  std::vector<float> host(count, static_cast<float>(rank + 1));
  RANK_CUDA(cudaMemcpyAsync(in, host.data(), count * sizeof(float), cudaMemcpyHostToDevice, s));
  if (out != in) RANK_CUDA(cudaMemsetAsync(out, 0xff, count * sizeof(float), s));
  comm.all_reduce(in, out, count, DataType::kFloat32, ReduceOp::kSum, s, algorithm);
  RANK_CUDA(cudaMemcpyAsync(host.data(), out, count * sizeof(float), cudaMemcpyDeviceToHost, s));
  RANK_CUDA(cudaStreamSynchronize(s));
  comm.check_errors();
  const auto wrong = std::count_if(host.begin(), host.end(), [](float v) { return v != 3.0f; });
  RANK_EXPECT(wrong == 0, "%s: %ld of %zu sums are not 3", when, static_cast<long>(wrong), count);
  return failures;
}

}  // namespace

// Both barrier kinds give up on a peer that left, after
// SYMMPOOL_BARRIER_TIMEOUT: the kernel by itself, the stream-memop one
// (cuStreamWaitValue32 waits forever) through the communicator's watchdog.
// So does a fused kernel, which meets its peers at its start and its end:
// once its start gave up, its end does not wait a second timeout, and the
// low-latency all-reduce, whose threads each wait for their peer's packets,
// and the two-step all-reduce, whose copies sit between two barriers. Work
// queued behind the failed one drains without its own timeout. The failure
// is sticky: it names the first collective that never finished and the
// rank that never came, the handler hears it once, and every later call
// raises it at once. Each case has its own group (a failed one stays failed).
TEST(Collectives, APeerThatStopsComingFailsTheCommunicatorForGood) {
  SYMMPOOL_GPUS_OR_SHARED_OR_SKIP(gpus, 2);
  shared_store_dir();
  const BarrierTimeout timeout;
  std::string result = run_ranks(2, 150, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    RankSetup setup(rank);
    auto& [device, store, alloc, s] = setup;
    struct Group {
      std::unique_ptr<SymmetricGroup> members;
      Communicator* comm = nullptr;
      int handled = 0;
      std::string heard;
    };
    constexpr int kGroups = 5;
    Group groups[kGroups];
    constexpr std::size_t kBytes = 4096;
    auto* gathered = static_cast<char*>(alloc.allocate(kBytes * world, reinterpret_cast<CUstream>(s)));
    for (int g = 0; g < kGroups; ++g) {
      Group& group = groups[g];
      auto heard = [&group](const std::string& m) {
        ++group.handled;
        group.heard = m;
      };
      group.members = std::make_unique<SymmetricGroup>(
          real_driver(), alloc, store, "dies" + std::to_string(g), rank, world, group_options(heard));
      group.comm = &group.members->communicator();
    }
    // While both ranks are here: a symmetric buffer that a fused all-gather
    // has already used, so what follows needs no heap exchange. After every
    // group formed: a later group's internal slot may map a segment of the
    // allocator they share, which makes the earlier heaps sync (an exchange)
    // at their next check.
    for (Group& group : groups)
      group.comm->all_gather(gathered + rank * kBytes, gathered, kBytes, s, Algorithm::kKernel);
    RANK_CUDA(cudaStreamSynchronize(s));
    if (rank == 1) return 0;  // leaves after setting up
    struct Case {
      const char* name;
      const char* op;
      std::function<void(Communicator&)> enqueue;
    };
    const Case cases[] = {
        {"kernel barrier", "barrier #2", [&](Communicator& c) { c.barrier(s, BarrierKind::kKernel); }},
        {"stream-op barrier", "barrier #2", [&](Communicator& c) { c.barrier(s, BarrierKind::kStreamOps); }},
        {"fused all-gather", "all_gather #2 (8192 bytes",
         [&](Communicator& c) {
           c.all_gather(gathered + rank * kBytes, gathered, kBytes, s, Algorithm::kKernel);
         }},
        {"low-latency all-reduce", "all_reduce #2 (4096 bytes",
         [&](Communicator& c) {
           c.all_reduce(gathered, gathered, kBytes / 4, DataType::kFloat32, ReduceOp::kSum, s,
                        Algorithm::kLowLatency);
         }},
        // On the whole gathered buffer, whose symmetry the all-gather checked.
        {"two-step all-reduce", "all_reduce #2 (8192 bytes",
         [&](Communicator& c) {
           c.all_reduce(gathered, gathered, kBytes * world / 4, DataType::kFloat32, ReduceOp::kSum, s,
                        Algorithm::kTwoStep);
         }},
    };
    for (int g = 0; g < kGroups; ++g) {
      const Case& c = cases[g];
      Communicator& comm = *groups[g].comm;
      const auto start = std::chrono::steady_clock::now();
      for (int queued = 0; queued < 3; ++queued) c.enqueue(comm);
      RANK_CUDA(cudaStreamSynchronize(s));  // the first gives up, the two behind it drain
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("[rank 0] 3 %s without their peer returned after %.1f s\n", c.name, waited);
      RANK_EXPECT(waited >= kTimeout - 1 && waited < kTimeout + 1, "3 %s returned after %.1f s", c.name,
                  waited);
      RANK_EXPECT(groups[g].handled == 1, "the handler heard %d failures", groups[g].handled);
      const std::string& heard = groups[g].heard;
      RANK_EXPECT(heard.find(c.op) != std::string::npos &&
                      heard.find("rank 1 did not arrive within 10 s") != std::string::npos,
                  "%s", heard.c_str());
      for (int again = 0; again < 2; ++again) {  // sticky, and raised at once
        const auto before = std::chrono::steady_clock::now();
        try {
          c.enqueue(comm);
          RANK_EXPECT(false, "a %s on a failed communicator was enqueued", c.name);
        } catch (const collective_error& e) {
          RANK_EXPECT(heard == e.what(), "%s", e.what());
        }
        RANK_EXPECT(std::chrono::steady_clock::now() - before < std::chrono::milliseconds(100),
                    "slow to raise");
      }
    }
    for (Group& g : groups) g.members.reset();  // returns: nothing waits on the dead peer
    return failures;
  });
  EXPECT_EQ(result, "");
}

// Not SPMD: rank 0 ran a call elsewhere (NCCL took it: a plain buffer on
// that rank only) while rank 1 ran it here, then both call here. Neither the
// low-latency all-reduce nor a barrier makes a symmetry exchange of its own,
// so nothing but the call number tells the ranks apart: rank 0 proves it is
// at the same call before it enqueues, and every rank raises within the
// timeout instead of pairing its call #3 with rank 1's call #2. Where both
// ran calls elsewhere, but a different number, they raise at once.
TEST(Collectives, CallsThatDifferBetweenRanksFailEveryRankLoudly) {
  SYMMPOOL_GPUS_OR_SHARED_OR_SKIP(gpus, 2);
  shared_store_dir();
  const BarrierTimeout timeout;
  std::string result = run_ranks(2, 150, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    RankSetup setup(rank);
    auto& [device, store, alloc, s] = setup;
    constexpr std::size_t kBytes = 4096;
    auto* buffer = static_cast<char*>(alloc.allocate(kBytes, reinterpret_cast<CUstream>(s)));
    RANK_CUDA(cudaMemsetAsync(buffer, 0, kBytes, s));
    struct Case {
      const char* name;
      int elsewhere[2];  // calls each rank runs elsewhere, then
      int here[2];       // calls it runs here
      double at_most_s;  // until every rank raised
      std::function<void(Communicator&)> enqueue;
    };
    const Case cases[] = {
        {"low-latency all-reduce",
         {1, 0},
         {1, 2},
         kTimeout + 1.5,
         [&](Communicator& c) {
           c.all_reduce(buffer, buffer, kBytes / 4, DataType::kFloat32, ReduceOp::kSum, s,
                        Algorithm::kLowLatency);
         }},
        {"stream-op barrier",
         {1, 0},
         {1, 2},
         kTimeout + 1.5,
         [&](Communicator& c) { c.barrier(s, BarrierKind::kStreamOps); }},
        {"low-latency all-reduce, both ran elsewhere",
         {2, 1},
         {1, 1},
         1.0,
         [&](Communicator& c) {
           c.all_reduce(buffer, buffer, kBytes / 4, DataType::kFloat32, ReduceOp::kSum, s,
                        Algorithm::kLowLatency);
         }},
    };
    int g = 0;
    for (const Case& c : cases) {
      SymmetricGroup group(real_driver(), alloc, store, "differ" + std::to_string(g++), rank, world,
                           group_options());
      Communicator& comm = group.communicator();
      c.enqueue(comm);  // call #1, alike on both ranks
      RANK_CUDA(cudaStreamSynchronize(s));
      const Raised raised = raised_by(comm, s, [&] {
        for (int i = 0; i < c.elsewhere[rank]; ++i) comm.count_call_run_elsewhere();
        for (int i = 0; i < c.here[rank]; ++i) c.enqueue(comm);
      });
      failures += failures_of(rank, c.name, raised, " #", c.at_most_s);  // " #": it names the call
    }
    return failures;
  });
  EXPECT_EQ(result, "");
}

// Low-latency all-reduces of different sizes on the two ranks (not SPMD):
// every rank raises within the timeout, the smaller one included, which
// once summed the first part of the larger one's input and went on.
TEST(Collectives, LowLatencyAllReducesOfDifferentSizesFailEveryRank) {
  SYMMPOOL_GPUS_OR_SHARED_OR_SKIP(gpus, 2);
  shared_store_dir();
  const BarrierTimeout timeout;
  std::string result = run_ranks(2, 120, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    RankSetup setup(rank);
    auto& [device, store, alloc, s] = setup;
    SymmetricGroup group(real_driver(), alloc, store, "sizes", rank, world, group_options());
    Communicator& comm = group.communicator();
    constexpr std::size_t kCount = 2048;  // floats
    auto* buffer = static_cast<float*>(alloc.allocate(kCount * sizeof(float), reinterpret_cast<CUstream>(s)));
    RANK_CUDA(cudaMemsetAsync(buffer, 0, kCount * sizeof(float), s));
    auto all_reduce = [&](std::size_t count) {
      comm.all_reduce(buffer, buffer, count, DataType::kFloat32, ReduceOp::kSum, s, Algorithm::kLowLatency);
    };
    all_reduce(kCount / 2);  // alike: passes
    RANK_CUDA(cudaStreamSynchronize(s));
    const Raised raised = raised_by(comm, s, [&] { all_reduce(rank == 0 ? kCount / 2 : kCount); });
    failures += failures_of(rank, "sizes that differ", raised, "all_reduce #2", kTimeout + 1.5);
    return failures;
  });
  EXPECT_EQ(result, "");
}

// Ranks whose calls pass symmetric buffers at different offsets, each
// buffer symmetric and its verdict cached (ranks that allocate differently
// shift later tensors onto addresses checked for others): every rank
// raises at once, naming the rank whose call differs. They used to pair
// the wrong buffers without a word. An all-gather against an all-reduce at
// the same call number fails the same way, also where one meets its peers
// inside a fused kernel and the other between barrier kernels, on other
// words of the pads: each finds the other's call in its call word (they
// once waited out the timeout, 10 s here).
TEST(Collectives, BuffersAtOtherOffsetsFailEveryRankEvenWithCachedVerdicts) {
  SYMMPOOL_GPUS_OR_SHARED_OR_SKIP(gpus, 2);
  shared_store_dir();
  const BarrierTimeout timeout;
  std::string result = run_ranks(2, 150, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    RankSetup setup(rank);
    auto& [device, store, alloc, s] = setup;
    constexpr std::size_t kLarge = kTwoShotLarge;
    char* a = setup.zeroed(kLarge);
    char* b = setup.zeroed(kLarge);
    auto all_reduce = [&](std::size_t bytes) -> BufferCall {
      return [&, bytes](Communicator& c, char* x) {
        c.all_reduce(x, x, bytes / 4, DataType::kFloat32, ReduceOp::kSum, s, Algorithm::kTwoShot);
      };
    };
    auto all_gather = [&](Algorithm algorithm) -> BufferCall {  // in place, 4 KiB per rank
      return
          [&, algorithm](Communicator& c, char* x) { c.all_gather(x + rank * 4096, x, 4096, s, algorithm); };
    };
    struct Case {
      const char* name;
      BufferCall call;
      BufferCall rank0_call;   // empty: `call`
      bool bracketed = false;  // as TwoShotCase's
    };
    const Case cases[] = {
        {"two-shot all-reduce, one fused kernel", all_reduce(16384), {}},
        {"large two-shot all-reduce, as the table runs it", all_reduce(kLarge), {}},
        {"two-shot all-reduce between barriers", all_reduce(kLarge), {}, true},
        {"copy-engine all-gather", all_gather(Algorithm::kCopyEnginePull), {}},
        {"kernel all-gather", all_gather(Algorithm::kKernel), {}},
        {"reduce-scatter",
         [&](Communicator& c, char* x) {
           c.reduce_scatter(x, x + kLarge / 2, 1024, DataType::kFloat32, ReduceOp::kSum, s);
         },
         {}},
        // A barrier kernel against a fused kernel: they meet on other words,
        // so each learns of the other's call from its call word (they once
        // waited out the timeout).
        {"an all-gather against a fused all-reduce", all_reduce(16384),
         all_gather(Algorithm::kCopyEnginePull)},
        {"an all-gather against a large all-reduce, as the table runs it", all_reduce(kLarge),
         all_gather(Algorithm::kCopyEnginePull)},
        {"an all-gather against an all-reduce between barriers", all_reduce(kLarge),
         all_gather(Algorithm::kCopyEnginePull), true},
        {"a fused all-gather against a copy-engine one", all_gather(Algorithm::kCopyEnginePull),
         all_gather(Algorithm::kKernel)},
    };
    int g = 0;
    for (const Case& c : cases) {
      const BufferCall both = [&](Communicator& comm, char* x) {
        c.call(comm, x);
        if (c.rank0_call) c.rank0_call(comm, x);
      };
      const BufferCall& mine = rank == 0 && c.rank0_call ? c.rank0_call : c.call;
      const Raised raised = raised_at_other_offsets(setup, rank, world, "offsets" + std::to_string(g++),
                                                    c.bracketed, a, b, both, mine);
      failures +=
          failures_of(rank, c.name, raised, "rank " + std::to_string(1 - rank) + " is at another call", 3.0);
    }
    return failures;
  });
  EXPECT_EQ(result, "");
}

// Copy-engine all-gathers whose meetings are stream memops (no kernel to
// compare digests): a call's first meeting is a checked one, whose waits
// pass only where the ranks' digests are equal. Ranks at other offsets
// both stop there, and the watchdog names the call that differs once the
// timeout is up, instead of letting the copies pair the wrong buffers. A
// peer meeting in a kernel learns of the other call at once from its call
// word; the rank meeting by stream memops waits out the timeout.
TEST(Collectives, StreamOpAllGathersAtOtherOffsetsFailEveryRankAfterTheTimeout) {
  SYMMPOOL_GPUS_OR_SHARED_OR_SKIP(gpus, 2);
  shared_store_dir();
  const BarrierTimeout timeout;
  std::string result = run_ranks(2, 150, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    RankSetup setup(rank);
    auto& [device, store, alloc, s] = setup;
    constexpr std::size_t kBytes = kTwoShotLarge;
    char* a = setup.zeroed(kBytes);
    char* b = setup.zeroed(kBytes);
    const BufferCall all_gather = [&](Communicator& c, char* x) {  // in place, by stream-op meetings
      c.all_gather(x + rank * (kBytes / 2), x, kBytes / 2, s, Algorithm::kCopyEnginePush,
                   BarrierKind::kStreamOps);
    };
    const BufferCall all_reduce = [&](Communicator& c, char* x) {  // between barrier kernels
      c.all_reduce(x, x, kBytes / 4, DataType::kFloat32, ReduceOp::kSum, s, Algorithm::kTwoShot);
    };
    struct Case {
      const char* name;
      bool rank1_all_reduces;
      std::string expected[2];
      double at_most_s[2];
    };
    const Case cases[] = {
        {"stream-op all-gathers at other offsets",
         false,
         {"rank 1 is at another call", "rank 0 is at another call"},
         {kTimeout + 1.5, kTimeout + 1.5}},
        {"a stream-op all-gather against an all-reduce between barrier kernels",
         true,
         {"all_gather #", "rank 0 is at another call"},
         {kTimeout + 1.5, 3.0}},
    };
    int g = 0;
    for (const Case& c : cases) {
      const BufferCall both = [&](Communicator& comm, char* x) {  // the meetings checked once
        all_gather(comm, x);
        if (c.rank1_all_reduces) all_reduce(comm, x);
      };
      const bool gathers = rank == 0 || !c.rank1_all_reduces;
      const Raised raised =
          raised_at_other_offsets(setup, rank, world, "stream-op offsets" + std::to_string(g++),
                                  /*bracketed=*/true, a, b, both, gathers ? all_gather : all_reduce);
      failures += failures_of(rank, c.name, raised, c.expected[rank], c.at_most_s[rank]);
    }
    return failures;
  });
  EXPECT_EQ(result, "");
}

// A peer that comes after the others gave up on it (TORCH_NCCL_ASYNC_ERROR_
// HANDLING=0: the failed rank goes on, and its queued kernels drain and
// signal): the late rank raises too, naming the rank that had failed. It
// used to pass that rank's signals and return what its draining kernels
// left, without a word.
TEST(Collectives, APeerLaterThanTheTimeoutFailsInsteadOfPassing) {
  SYMMPOOL_GPUS_OR_SHARED_OR_SKIP(gpus, 2);
  shared_store_dir();
  const BarrierTimeout timeout;
  std::string result = run_ranks(2, 150, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    RankSetup setup(rank);
    auto& [device, store, alloc, s] = setup;
    constexpr std::size_t kLarge = kTwoShotLarge;
    auto* buffer = static_cast<char*>(alloc.allocate(kLarge, reinterpret_cast<CUstream>(s)));
    RANK_CUDA(cudaMemsetAsync(buffer, 0, kLarge, s));
    const auto groups = setup.two_shot_groups("late", rank, world);
    for (int g = 0; g < kTwoShotCaseCount; ++g) {
      const TwoShotCase& c = kTwoShotCases[g];
      Communicator& comm = groups[static_cast<std::size_t>(g)]->communicator();
      auto all_reduce = [&] { c.all_reduce(comm, buffer, s); };
      all_reduce();  // alike and in time: the buffer's verdict is cached
      RANK_CUDA(cudaStreamSynchronize(s));
      comm.check_errors();
      if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(kTimeout + 2));
      const Raised raised = raised_by(comm, s, all_reduce);
      failures += rank == 0 ? failures_of(rank, c.name, raised, "rank 1 did not arrive", kTimeout + 1.5)
                            : failures_of(rank, c.name, raised, "rank 0 had failed before", 3.0);
    }
    return failures;
  });
  EXPECT_EQ(result, "");
}

// A captured collective replayed beside an eager call that fails (graphs
// are not ordered against eager calls: IssueOrder orders the eager ones)
// ends only once the failure is on record and the handler returned (the
// torch backend aborts there). Its kernels once returned at once where they
// found the communicator failed, at their start or during a wait: the
// replay's stream drained while the host knew nothing, and a Work or event
// waited on there read as a success. Here the handler takes 1.5 s; a replay
// that starts once the failure is marked (the kernels' start), or 1 s into
// the failing barrier's wait (a wait that gives up early: it starts later,
// so it cannot time out first), must not drain before it returned, nor
// much after (the acknowledgement lets it go, not the hold's timeout).
TEST(Collectives, AReplayBesideAFailedCallEndsOnlyOnceTheFailureIsOnRecord) {
  SYMMPOOL_GPUS_OR_SHARED_OR_SKIP(gpus, 2);
  shared_store_dir();
  const BarrierTimeout timeout;
  std::string result = run_ranks(2, 150, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    constexpr int kPatience = 3;  // seconds: each case waits it out once
    ::setenv("SYMMPOOL_BARRIER_TIMEOUT", std::to_string(kPatience).c_str(), 1);
    RankSetup setup(rank);
    auto& [device, store, alloc, s] = setup;
    cudaStream_t replays = nullptr;
    RANK_CUDA(cudaStreamCreateWithFlags(&replays, cudaStreamNonBlocking));
    constexpr std::size_t kBytes = std::size_t{4} << 20;  // 2 MiB a peer: between barriers where bracketed
    char* buffer = setup.zeroed(kBytes);
    struct Case {
      const char* name;
      bool bracketed;
      bool during_the_wait;  // the replay starts 1 s into the failing barrier's wait, else once it failed
      std::function<void(Communicator&, cudaStream_t)> call;
    };
    auto all_reduce = [&](std::size_t bytes, Algorithm algorithm) {
      return [=](Communicator& c, cudaStream_t on) {
        c.all_reduce(buffer, buffer, bytes / 4, DataType::kFloat32, ReduceOp::kSum, on, algorithm);
      };
    };
    auto barrier = [](Communicator& c, cudaStream_t on) { c.barrier(on, BarrierKind::kKernel); };
    const Case cases[] = {
        {"kernel barrier replayed after the failure", false, false, barrier},
        {"kernel barrier waiting beside the failing one", false, true, barrier},
        {"fused two-shot all-reduce", false, false, all_reduce(16384, Algorithm::kTwoShot)},
        {"two-shot all-reduce between barriers", true, false, all_reduce(kBytes, Algorithm::kTwoShot)},
        {"low-latency all-reduce", false, false, all_reduce(4096, Algorithm::kLowLatency)},
    };
    constexpr int kCases = sizeof(cases) / sizeof(cases[0]);
    // Rank 0's handler: opens the gate, then takes its time.
    using Clock = std::chrono::steady_clock;
    struct Handled {
      std::atomic<Clock::rep> returned_at{0};  // Clock ticks; 0 while it has not returned
    };
    Handled handled[kCases];
    volatile int* gate = nullptr;  // host-mapped: the replays wait for it on the GPU
    RANK_CUDA(cudaHostAlloc(const_cast<int**>(&gate), sizeof(int), cudaHostAllocMapped));
    void* gate_on_device = nullptr;
    RANK_CUDA(cudaHostGetDevicePointer(&gate_on_device, const_cast<int*>(gate), 0));
    std::vector<std::unique_ptr<SymmetricGroup>> groups;
    for (int g = 0; g < kCases; ++g) {
      Handled* h = &handled[g];
      auto slow = [h, gate](const std::string&) {
        *gate = 1;
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        h->returned_at = Clock::now().time_since_epoch().count();
      };
      groups.push_back(std::make_unique<SymmetricGroup>(real_driver(), alloc, store,
                                                        "beside" + std::to_string(g), rank, world,
                                                        group_options(slow, cases[g].bracketed)));
    }
    // Both ranks: each call once eagerly (verdicts and scratch outside the
    // capture), then captured.
    std::vector<cudaGraphExec_t> graphs;
    for (int g = 0; g < kCases; ++g) {
      Communicator& comm = groups[static_cast<std::size_t>(g)]->communicator();
      cases[g].call(comm, replays);
      RANK_CUDA(cudaStreamSynchronize(replays));
      comm.check_errors();
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      RANK_CUDA(cudaStreamBeginCapture(replays, cudaStreamCaptureModeThreadLocal));
      cases[g].call(comm, replays);
      RANK_CUDA(cudaStreamEndCapture(replays, &graph));
      RANK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      RANK_CUDA(cudaGraphDestroy(graph));
      graphs.push_back(exec);
    }
    if (rank == 1) {  // stays, calling nothing, until rank 0 is done
      store.get("test/beside-done", std::chrono::seconds(120));
    } else {
      for (int g = 0; g < kCases; ++g) {
        const Case& c = cases[g];
        Communicator& comm = groups[static_cast<std::size_t>(g)]->communicator();
        *gate = 0;
        const CUresult held = real_driver().cuStreamWaitValue32(reinterpret_cast<CUstream>(replays),
                                                                reinterpret_cast<CUdeviceptr>(gate_on_device),
                                                                1, CU_STREAM_WAIT_VALUE_GEQ);
        RANK_EXPECT(held == CUDA_SUCCESS, "cuStreamWaitValue32: %d", static_cast<int>(held));
        RANK_CUDA(cudaGraphLaunch(graphs[static_cast<std::size_t>(g)], replays));
        barrier(comm, s);  // where rank 1 never comes
        // Where the replay waits too, it starts later: the barrier gives up first.
        if (c.during_the_wait) {
          std::this_thread::sleep_for(std::chrono::seconds(1));
          *gate = 1;
        }
        // Nothing waits forever: polled, and given up on after three timeouts.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3 * kPatience + 10);
        cudaError_t e = cudaErrorNotReady;
        while ((e = cudaStreamQuery(replays)) == cudaErrorNotReady &&
               std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        const Clock::rep returned_at = handled[g].returned_at;
        const bool handler_returned = returned_at != 0;
        const Clock::time_point drained = Clock::now();
        if (e == cudaErrorNotReady) {
          RANK_EXPECT(false, "%s: the replay never drained", c.name);
          *gate = 1;
          RANK_CUDA(cudaStreamSynchronize(replays));
        } else {
          RANK_EXPECT(e == cudaSuccess, "%s: the replay's stream: %s", c.name, cudaGetErrorString(e));
          RANK_EXPECT(handler_returned, "%s: the replay ended before the failure was handled", c.name);
          // Let go by the acknowledgement, not by the hold's own timeout
          // (kPatience after the gate opened: 1.5 s after the handler returned).
          const double late =
              std::chrono::duration<double>(drained - Clock::time_point(Clock::duration(returned_at)))
                  .count();
          RANK_EXPECT(!handler_returned || late < 1.0,
                      "%s: the replay drained %.1f s after the handler returned", c.name, late);
        }
        failures +=
            failures_of(rank, c.name, raised_by(comm, s, [] {}), "rank 1 did not arrive", kPatience + 3.0);
      }
      store.set("test/beside-done", "");
    }
    for (cudaGraphExec_t exec : graphs) RANK_CUDA(cudaGraphExecDestroy(exec));
    groups.clear();
    RANK_CUDA(cudaFreeHost(const_cast<int*>(gate)));
    RANK_CUDA(cudaStreamDestroy(replays));
    return failures;
  });
  EXPECT_EQ(result, "");
}

// A rank whose wait gave up leaves its peers' buffers alone: neither the
// kernel whose wait it was nor a call queued behind it writes into them
// (they once went on after the timeout, a fused kernel and the reduction
// between two barriers alike, and two-shot wrote its sums into the late
// peer's output while that peer had not called anything). Its queued call
// keeps the failed-rank mark in the late peer's pads, instead of writing its
// own digest over it: the late peer's call fails naming the rank that had
// failed, not "another call".
TEST(Collectives, AFailedRankLeavesItsPeersBuffersAlone) {
  SYMMPOOL_GPUS_OR_SHARED_OR_SKIP(gpus, 2);
  shared_store_dir();
  const BarrierTimeout timeout;
  std::string result = run_ranks(2, 150, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    RankSetup setup(rank);
    auto& [device, store, alloc, s] = setup;
    constexpr std::size_t kLarge = kTwoShotLarge;
    constexpr float kUntouched = 5.0f;
    auto* buffer = static_cast<float*>(alloc.allocate(kLarge, reinterpret_cast<CUstream>(s)));
    std::vector<float> host(kLarge / sizeof(float), 0.0f);
    const auto groups = setup.two_shot_groups("alone", rank, world);
    for (int g = 0; g < kTwoShotCaseCount; ++g) {
      const TwoShotCase& c = kTwoShotCases[g];
      Communicator& comm = groups[static_cast<std::size_t>(g)]->communicator();
      auto all_reduce = [&] { c.all_reduce(comm, buffer, s); };
      RANK_CUDA(cudaMemsetAsync(buffer, 0, kLarge, s));
      all_reduce();  // alike and in time: both ranks are past it
      RANK_CUDA(cudaStreamSynchronize(s));
      comm.check_errors();
      if (rank == 0) {  // gives up on rank 1, with a second call queued behind the first
        // Ones: a sum written into rank 1's buffer then differs from what it holds.
        std::fill(host.begin(), host.end(), 1.0f);
        RANK_CUDA(cudaMemcpy(buffer, host.data(), kLarge, cudaMemcpyHostToDevice));
        const Raised raised = raised_by(comm, s, [&] {
          all_reduce();
          all_reduce();
        });
        failures += failures_of(rank, c.name, raised, "rank 1 did not arrive", kTimeout + 1.5);
        continue;
      }
      std::fill(host.begin(), host.end(), kUntouched);
      RANK_CUDA(cudaMemcpy(buffer, host.data(), kLarge, cudaMemcpyHostToDevice));
      std::this_thread::sleep_for(std::chrono::seconds(kTimeout + 3));  // rank 0 has failed meanwhile
      RANK_CUDA(cudaMemcpy(host.data(), buffer, kLarge, cudaMemcpyDeviceToHost));
      const auto written = std::count_if(host.begin(), host.end(), [](float v) { return v != kUntouched; });
      RANK_EXPECT(written == 0, "%s: the failed rank wrote %ld of our %zu floats", c.name,
                  static_cast<long>(written), host.size());
      failures += failures_of(rank, c.name, raised_by(comm, s, all_reduce), "rank 0 had failed before", 3.0);
    }
    return failures;
  });
  EXPECT_EQ(result, "");
}

// Three ranks; rank 0 gives up on rank 2 (5 s), rank 1 (30 s) does not,
// and rank 2 comes at 8 s, finds rank 0's mark and fails; both have a
// second call queued. Rank 1 passed the call's first meeting with both, so
// it must learn of the failure at the next meeting, where both failed ranks
// are missing: it once passed a barrier they signalled without waiting, or
// signalled at their next call's first meeting (after skipping their
// two-shot chunks: a sum with two chunks unwritten, returned as a
// success), or waited out its timeout at a fused kernel's end, which they
// skipped. Now they leave their failed-rank mark there and send no signal,
// and rank 1 fails at once.
TEST(Collectives, ARankBetweenFailedPeersFailsAtTheMeetingTheySkip) {
  SYMMPOOL_GPUS_OR_SHARED_OR_SKIP(gpus, 3);
  shared_store_dir();
  const BarrierTimeout timeout;
  std::string result = run_ranks(3, 150, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    const int patience[] = {5, 30, 30};  // seconds, per rank
    ::setenv("SYMMPOOL_BARRIER_TIMEOUT", std::to_string(patience[rank]).c_str(), 1);
    RankSetup setup(rank);
    auto& [device, store, alloc, s] = setup;
    constexpr std::size_t kLarge = kTwoShotLarge;
    auto* buffer = static_cast<float*>(alloc.allocate(kLarge, reinterpret_cast<CUstream>(s)));
    const auto groups = setup.two_shot_groups("between", rank, world);
    auto all_meet = [&](const std::string& where) {  // on the host, through the store
      store.set(where + "/" + std::to_string(rank), "");
      for (int r = 0; r < world; ++r) store.get(where + "/" + std::to_string(r), std::chrono::seconds(60));
    };
    for (int g = 0; g < kTwoShotCaseCount; ++g) {
      const TwoShotCase& c = kTwoShotCases[g];
      Communicator& comm = groups[static_cast<std::size_t>(g)]->communicator();
      auto all_reduce = [&] { c.all_reduce(comm, buffer, s); };
      all_meet("before" + std::to_string(g));
      RANK_CUDA(cudaMemsetAsync(buffer, 0, kLarge, s));
      all_reduce();  // alike and in time: the buffer's verdict is cached
      RANK_CUDA(cudaStreamSynchronize(s));
      comm.check_errors();
      all_meet("start" + std::to_string(g));
      if (rank == 2) std::this_thread::sleep_for(std::chrono::seconds(8));
      const Raised raised = raised_by(comm, s, [&] {
        all_reduce();
        if (rank != 1) all_reduce();  // queued behind the call that fails
      });
      failures += rank == 0   ? failures_of(rank, c.name, raised, "rank 2 did not arrive", 6.5)
                  : rank == 1 ? failures_of(rank, c.name, raised, "had failed before", 11.0)
                              : failures_of(rank, c.name, raised, "rank 0 had failed before", 3.0);
    }
    return failures;
  });
  EXPECT_EQ(result, "");
}

// Not a failure: an out-of-place all-reduce whose output lies at another
// offset on each rank (rank 0 allocated more before it) falls back from
// two-shot to one-shot, which writes its output locally, and sums right.
// The output's offset once went into the call's digest all the same, so
// the digests differed and both ranks failed.
TEST(Collectives, AnOutputAtOtherOffsetsFallsBackToOneShotWithTheRightSum) {
  SYMMPOOL_GPUS_OR_SHARED_OR_SKIP(gpus, 2);
  shared_store_dir();
  const BarrierTimeout timeout;
  std::string result = run_ranks(2, 120, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    RankSetup setup(rank);
    auto& [device, store, alloc, s] = setup;
    SymmetricGroup group(real_driver(), alloc, store, "fallback", rank, world, group_options());
    Communicator& comm = group.communicator();
    constexpr std::size_t kCount = 16384;  // 64 KiB: two-shot by the table at 2 ranks
    const auto cu = reinterpret_cast<CUstream>(s);
    auto* in = static_cast<float*>(alloc.allocate(kCount * sizeof(float), cu));
    void* extra = rank == 0 ? alloc.allocate(kCount * sizeof(float), cu) : nullptr;
    auto* out = static_cast<float*>(alloc.allocate(kCount * sizeof(float), cu));
    try {  // the verdicts checked, then cached
      for (const char* when : {"first call", "second call"})
        failures += failures_of_summing(comm, s, in, out, kCount, rank, Algorithm::kAuto, when);
    } catch (const std::exception& e) {
      RANK_EXPECT(false, "%s", e.what());
    }
    if (extra) alloc.deallocate(extra, cu);
    return failures;
  });
  EXPECT_EQ(result, "");
}

// Not a failure: a rank that maps a segment its peers did not (an
// allocation made on that rank only), or unmaps it again, keeps using the
// verdicts it cached. It used to ask its peers again, alone, because its
// segments had changed since the last sync (later: because it had unmapped
// one): it waited for an exchange they never made, and both ranks failed
// after the timeout.
TEST(Collectives, AnAllocationOnOneRankOnlyKeepsCachedVerdicts) {
  SYMMPOOL_GPUS_OR_SHARED_OR_SKIP(gpus, 2);
  shared_store_dir();
  const BarrierTimeout timeout;
  std::string result = run_ranks(2, 120, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    RankSetup setup(rank);
    auto& [device, store, alloc, s] = setup;
    SymmetricGroup group(real_driver(), alloc, store, "one-sided", rank, world, group_options());
    Communicator& comm = group.communicator();
    constexpr std::size_t kCount = 4096;
    auto* buffer = static_cast<float*>(alloc.allocate(kCount * sizeof(float), reinterpret_cast<CUstream>(s)));
    auto all_reduce_and_check = [&](const char* when) {
      return failures_of_summing(comm, s, buffer, buffer, kCount, rank, Algorithm::kTwoShot, when);
    };
    try {
      if (all_reduce_and_check("first call") != 0) return 1;  // checks the buffer: cached from here on
      void* extra = nullptr;
      if (rank == 1)
        extra = alloc.allocate(64 << 20, reinterpret_cast<CUstream>(s));  // a new segment here only
      const auto start = std::chrono::steady_clock::now();
      if (all_reduce_and_check("after rank 1's own allocation") != 0) return 1;
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      RANK_EXPECT(took < kTimeout / 2.0, "the call took %.1f s", took);
      if (extra) {  // and unmaps it alone (a local empty_cache, an out-of-memory retry)
        alloc.deallocate(extra, reinterpret_cast<CUstream>(s));
        RANK_CUDA(cudaStreamSynchronize(s));
        RANK_EXPECT(alloc.empty_cache() > 0, "rank 1's own segment was not released");
      }
      const auto restart = std::chrono::steady_clock::now();
      if (all_reduce_and_check("after rank 1 released its own segment") != 0) return 1;
      const double retook = std::chrono::duration<double>(std::chrono::steady_clock::now() - restart).count();
      RANK_EXPECT(retook < kTimeout / 2.0, "the call after the release took %.1f s", retook);
    } catch (const std::exception& e) {
      RANK_EXPECT(false, "%s", e.what());
    }
    return failures;
  });
  EXPECT_EQ(result, "");
}

// A communicator whose construction fails after it took its internal slot
// (its peer joined allocate_internal, then never came to the sync that
// follows) gives the slot back: the next communicator of this process takes
// the same slot, so later groups' offsets do not shift.
TEST(Collectives, ACommunicatorThatFailsToFormGivesItsSlotBack) {
  SYMMPOOL_GPUS_OR_SHARED_OR_SKIP(gpus, 2);
  shared_store_dir();
  std::string result = run_ranks(2, 120, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    RANK_CUDA(cudaSetDevice(device_of_rank(rank)));
    FileStore store(shared_store_dir());
    CachingAllocator& alloc = device_allocator(device_of_rank(rank));
    SymmetricHeap heap(real_driver(), alloc, store, "half-formed", rank, world,
                       HeapOptions{std::chrono::seconds(3)});
    const std::uint64_t free_before = alloc.free_internal_slots();
    if (rank == 1) {  // takes part in allocate_internal only, as a peer that dies right after would
      void* slot = heap.allocate_internal();
      store.get("test/rank0-done", std::chrono::seconds(60));
      heap.release_internal(slot);
      return 0;
    }
    try {
      Communicator comm(heap, alloc, std::chrono::seconds(3));
      RANK_EXPECT(false, "a communicator formed without its peer");
    } catch (const std::exception& e) {
      std::printf("[rank 0] the communicator did not form: %s\n", e.what());
    }
    const std::uint64_t free_after = alloc.free_internal_slots();
    RANK_EXPECT(free_after == free_before,
                "internal slots free before 0x%llx, after the failed constructor 0x%llx",
                static_cast<unsigned long long>(free_before), static_cast<unsigned long long>(free_after));
    store.set("test/rank0-done", "");
    return failures;
  });
  EXPECT_EQ(result, "");
}

// Like NCCL, one GPU per rank: a group whose ranks share a GPU is refused
// when its heap forms, on every rank, naming the ranks and the GPU.
TEST(Collectives, TwoRanksOnOneGpuAreRefusedByName) {
  SYMMPOOL_GPUS_OR_SKIP(gpus, 1);
  shared_store_dir();
  std::string result = run_ranks(2, 120, [&](int rank, int world, Rendezvous&) {
    int failures = 0;
    ::unsetenv("SYMMPOOL_TEST_RANKS_SHARE_GPU");  // the tests-only switch that allows it
    RANK_CUDA(cudaSetDevice(0));
    FileStore store(shared_store_dir());
    try {
      SymmetricHeap heap(real_driver(), device_allocator(0), store, "crowded", rank, world);
      RANK_EXPECT(false, "two ranks on GPU 0 formed a heap");
    } catch (const logic_error& e) {
      std::printf("[rank %d] %s\n", rank, e.what());
      RANK_EXPECT(std::strstr(e.what(), "ranks 0 and 1 both use the GPU at PCI ") &&
                      std::strstr(e.what(), "symmpool needs one GPU per rank"),
                  "%s", e.what());
    }
    return failures;
  });
  EXPECT_EQ(result, "");
}

}  // namespace symmpool::test
