// One process per GPU: NCCL all-gather and reduce-scatter on buffers that
// symmpool registered with the communicator equal NCCL on plain cudaMalloc
// buffers and the host reference; registrations stay flat in steady state.

#include "process_group.hpp"
#include "rank_checks.hpp"

#include <symmpool/device_allocators.hpp>
#include <symmpool/nccl_registration.hpp>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace symmpool::test {

namespace {

constexpr int kTimeoutSeconds = 240;

// Random small integers: exact in fp32 and bf16 and in any summation order,
// so registered and plain runs must agree bit for bit.
std::vector<float> rank_data(int rank, std::size_t count, unsigned seed) {
  std::mt19937 rng(seed * 1000u + static_cast<unsigned>(rank));
  std::uniform_int_distribution<int> dist(-8, 8);
  std::vector<float> v(count);
  for (auto& x : v) x = static_cast<float>(dist(rng));
  return v;
}

std::vector<unsigned char> encode(const std::vector<float>& v, ncclDataType_t type) {
  std::vector<unsigned char> out;
  for (float f : v) {
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if (type == ncclFloat32) {
      for (int b = 0; b < 4; ++b) out.push_back(static_cast<unsigned char>(bits >> (8 * b)));
    } else {  // bf16: the high half, exact for these integers
      out.push_back(static_cast<unsigned char>(bits >> 16));
      out.push_back(static_cast<unsigned char>(bits >> 24));
    }
  }
  return out;
}

struct Buffers {
  void* in;
  void* out;
};

int check_collectives(int rank, int world, ncclComm_t comm, cudaStream_t stream, unsigned seed) {
  auto& alloc = device_allocator(rank);
  auto cu = reinterpret_cast<CUstream>(stream);
  int failures = 0;
  for (ncclDataType_t type : {ncclFloat32, ncclBfloat16}) {
    const std::size_t elem = type == ncclFloat32 ? 4 : 2;
    for (std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t{1001}, std::size_t{65537},
                              (std::size_t{1} << 20) + 7}) {
      for (int op = 0; op < 2; ++op) {  // 0: all-gather, 1: reduce-scatter (sum)
        const std::size_t in_count = op == 0 ? count : count * world;
        const std::size_t out_count = op == 0 ? count * world : count;
        auto mine = encode(rank_data(rank, in_count, seed), type);
        std::vector<float> expect_f(out_count, 0.f);
        for (int r = 0; r < world; ++r) {
          auto d = rank_data(r, in_count, seed);
          if (op == 0)
            std::copy(d.begin(), d.end(), expect_f.begin() + static_cast<std::ptrdiff_t>(r * count));
          else
            for (std::size_t i = 0; i < count; ++i)
              expect_f[i] += d[static_cast<std::size_t>(rank) * count + i];
        }
        auto expect = encode(expect_f, type);

        Buffers sym{alloc.allocate(in_count * elem, cu), alloc.allocate(out_count * elem, cu)};
        Buffers plain{};
        RANK_CUDA(cudaMalloc(&plain.in, in_count * elem));
        RANK_CUDA(cudaMalloc(&plain.out, out_count * elem));
        for (Buffers b : {sym, plain}) {
          RANK_CUDA(cudaMemcpyAsync(b.in, mine.data(), mine.size(), cudaMemcpyHostToDevice, stream));
          RANK_CUDA(cudaMemsetAsync(b.out, 0xff, out_count * elem, stream));  // poison
          if (op == 0)
            RANK_NCCL(ncclAllGather(b.in, b.out, count, type, comm, stream));
          else
            RANK_NCCL(ncclReduceScatter(b.in, b.out, count, type, ncclSum, comm, stream));
        }
        std::vector<unsigned char> got_sym(out_count * elem), got_plain(out_count * elem);
        RANK_CUDA(cudaMemcpyAsync(got_sym.data(), sym.out, got_sym.size(), cudaMemcpyDeviceToHost, stream));
        RANK_CUDA(
            cudaMemcpyAsync(got_plain.data(), plain.out, got_plain.size(), cudaMemcpyDeviceToHost, stream));
        RANK_CUDA(cudaStreamSynchronize(stream));
        if (got_sym != expect || got_plain != expect) {
          std::fprintf(stderr, "[rank %d] %s %s count=%zu: registered %s, plain %s\n", rank,
                       op == 0 ? "all-gather" : "reduce-scatter", type == ncclFloat32 ? "fp32" : "bf16",
                       count, got_sym == expect ? "ok" : "WRONG", got_plain == expect ? "ok" : "WRONG");
          ++failures;
        }
        alloc.deallocate(sym.in, cu);
        alloc.deallocate(sym.out, cu);
        RANK_CUDA(cudaFree(plain.in));
        RANK_CUDA(cudaFree(plain.out));
      }
    }
  }
  return failures;
}

int registered_matches_plain(int rank, int world, Rendezvous& rv) {
  ncclComm_t comm = init_nccl(rank, world, rv, kTimeoutSeconds);
  cudaStream_t stream;
  RANK_CUDA(cudaStreamCreate(&stream));
  auto& alloc = device_allocator(rank);
  NcclRegistrationHook hook(comm);
  alloc.add_observer(&hook, true);

  int failures = check_collectives(rank, world, comm, stream, 1);
  if (hook.counts().registrations == 0) {
    std::fprintf(stderr, "[rank %d] no segment was registered\n", rank);
    ++failures;
  }

  // Steady state: the same buffers every step, so no new registration.
  auto cu = reinterpret_cast<CUstream>(stream);
  std::uint64_t after_first = 0;
  for (int it = 0; it < 100; ++it) {
    void* in = alloc.allocate(std::size_t{16} << 20, cu);
    void* out = alloc.allocate((std::size_t{16} << 20) * world, cu);
    RANK_NCCL(ncclAllGather(in, out, std::size_t{8} << 20, ncclBfloat16, comm, stream));
    alloc.deallocate(in, cu);
    alloc.deallocate(out, cu);
    if (it == 0) after_first = hook.counts().registrations;
  }
  RANK_CUDA(cudaStreamSynchronize(stream));
  auto counts = hook.counts();
  std::printf("[rank %d] registrations after step 1: %llu, after step 100: %llu, live segments %zu\n", rank,
              static_cast<unsigned long long>(after_first),
              static_cast<unsigned long long>(counts.registrations), counts.live);
  if (counts.registrations != after_first) ++failures;

  failures += check_collectives(rank, world, comm, stream, 2);  // after reuse, fresh data
  alloc.remove_observer(&hook, true);
  if (hook.counts().live != 0) ++failures;
  RANK_NCCL(ncclCommDestroy(comm));
  return failures == 0 ? 0 : 1;
}

}  // namespace

TEST(MultiGpuNccl, RegisteredBuffersMatchPlainBuffersOnAllGpus) {
  SYMMPOOL_GPUS_OR_SKIP(gpus, 2);
  EXPECT_EQ(run_ranks(gpus, kTimeoutSeconds, registered_matches_plain), "");
}

TEST(MultiGpuNccl, APeerThatNeverArrivesTimesOutInsteadOfHanging) {
  SYMMPOOL_GPUS_OR_SKIP(gpus, 2);
  // Rank 1 exits at once; rank 0 blocks in NCCL init waiting for it. The
  // harness must kill it at the deadline and say so.
  std::string result = run_ranks(2, 20, [](int rank, int world, Rendezvous& rv) {
    if (rank == 1) return 0;
    init_nccl(rank, world, rv, 20);
    return 0;
  });
  EXPECT_NE(result.find("rank 0 hung past 20 s"), std::string::npos) << result;
}

}  // namespace symmpool::test
