// symmpool's collectives against NCCL, one process per GPU: random data,
// every dtype, odd sizes, in and out of place, both barrier kinds, many
// back-to-back runs, inside a CUDA graph, and the errors for bad input.

#include "process_group.hpp"
#include "rank_checks.hpp"

#include <symmpool/communicator.hpp>
#include <symmpool/device_allocators.hpp>
#include <symmpool/error.hpp>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace symmpool::test {

namespace {

constexpr int kTimeoutSeconds = 300;

std::string store_dir() {
  static std::string dir = [] {
    char tmpl[] = "/tmp/symmpool-coll-XXXXXX";
    return std::string(mkdtemp(tmpl));
  }();
  return dir;
}

ncclDataType_t nccl_type(DataType t) {
  return t == DataType::kFloat32 ? ncclFloat32 : t == DataType::kFloat16 ? ncclFloat16 : ncclBfloat16;
}

// Random small integers, encoded in `t`: exact in every dtype and any order.
std::vector<unsigned char> random_ints(std::mt19937& rng, std::size_t count, DataType t) {
  std::uniform_int_distribution<int> dist(-8, 8);
  std::vector<unsigned char> out(count * element_size(t));
  for (std::size_t i = 0; i < count; ++i) {
    float f = static_cast<float>(dist(rng));
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if (t == DataType::kFloat32) {
      std::memcpy(&out[i * 4], &bits, 4);
    } else if (t == DataType::kBFloat16) {
      std::uint16_t h = static_cast<std::uint16_t>(bits >> 16);
      std::memcpy(&out[i * 2], &h, 2);
    } else {  // fp16 of a small integer: exponent rebias, mantissa exact
      int v = static_cast<int>(f);
      std::uint16_t h = 0;
      if (v != 0) {
        unsigned a = static_cast<unsigned>(v < 0 ? -v : v);
        int e = 31 - __builtin_clz(a);
        h = static_cast<std::uint16_t>((v < 0 ? 0x8000 : 0) | ((e + 15) << 10) | ((a << (10 - e)) & 0x3ff));
      }
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

struct AllGatherCase {
  Algorithm algorithm;
  BarrierKind barrier;
  const char* name;
};
constexpr AllGatherCase kAllGatherCases[] = {
    {Algorithm::kCopyEnginePull, BarrierKind::kKernel, "all_gather copy-engine pull"},
    {Algorithm::kCopyEnginePull, BarrierKind::kStreamOps, "all_gather copy-engine pull (stream ops)"},
    {Algorithm::kCopyEnginePush, BarrierKind::kKernel, "all_gather copy-engine push"},
    {Algorithm::kCopyEnginePush, BarrierKind::kStreamOps, "all_gather copy-engine push (stream ops)"},
    {Algorithm::kKernel, BarrierKind::kKernel, "all_gather kernel"},
};

struct Ctx {
  int rank, world;
  ncclComm_t nccl;
  cudaStream_t stream;
  CachingAllocator* alloc;
  Communicator* comm;
};

void* dev(Ctx& c, std::size_t bytes) { return c.alloc->allocate(bytes, reinterpret_cast<CUstream>(c.stream)); }
void release(Ctx& c, void* p) { c.alloc->deallocate(p, reinterpret_cast<CUstream>(c.stream)); }

int compare(Ctx& c, const void* a, const void* b, std::size_t bytes, const char* what, DataType t,
            std::size_t count) {
  const int rank = c.rank;
  int failures = 0;
  std::vector<unsigned char> x(bytes), y(bytes);
  RANK_CUDA(cudaMemcpyAsync(x.data(), a, bytes, cudaMemcpyDeviceToHost, c.stream));
  RANK_CUDA(cudaMemcpyAsync(y.data(), b, bytes, cudaMemcpyDeviceToHost, c.stream));
  RANK_CUDA(cudaStreamSynchronize(c.stream));
  RANK_EXPECT(x == y, "%s %s count=%zu differs from NCCL", what, to_string(t).c_str(), count);
  return failures;
}

int correctness(Ctx& c) {
  const int rank = c.rank, world = c.world;
  int failures = 0;
  std::mt19937 rng(1234u + static_cast<unsigned>(rank));
  for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
    const std::size_t es = element_size(t);
    for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{1001}, std::size_t{65537},
                          (std::size_t{1} << 20) + 7}) {
      const std::size_t bytes = n * es, total = bytes * world;
      // all-gather, out of place, both barrier kinds, and in place
      auto data = random_ints(rng, n, t);
      void* in = dev(c, bytes);
      void* out = dev(c, total);
      void* ref = dev(c, total);
      RANK_CUDA(cudaMemcpyAsync(in, data.data(), bytes, cudaMemcpyHostToDevice, c.stream));
      RANK_NCCL(ncclAllGather(in, ref, n, nccl_type(t), c.nccl, c.stream));
      for (const AllGatherCase& ag : kAllGatherCases) {
        RANK_CUDA(cudaMemsetAsync(out, 0xff, total, c.stream));  // poison
        c.comm->all_gather(in, out, bytes, c.stream, ag.algorithm, ag.barrier);
        failures += compare(c, out, ref, total, ag.name, t, n);
        RANK_CUDA(cudaMemsetAsync(out, 0xff, total, c.stream));
        void* slice = static_cast<char*>(out) + static_cast<std::size_t>(rank) * bytes;
        RANK_CUDA(cudaMemcpyAsync(slice, data.data(), bytes, cudaMemcpyHostToDevice, c.stream));
        c.comm->all_gather(slice, out, bytes, c.stream, ag.algorithm, ag.barrier);
        failures += compare(c, out, ref, total, (std::string(ag.name) + " in place").c_str(), t, n);
      }
      release(c, in);
      release(c, out);
      release(c, ref);

      // reduce-scatter and all-reduce, sum and avg
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        auto rs_data = random_ints(rng, n * world, t);
        void* rs_in = dev(c, total);
        void* rs_out = dev(c, bytes);
        void* rs_ref = dev(c, bytes);
        RANK_CUDA(cudaMemcpyAsync(rs_in, rs_data.data(), total, cudaMemcpyHostToDevice, c.stream));
        const ncclRedOp_t nccl_op = op == ReduceOp::kSum ? ncclSum : ncclAvg;
        const std::string op_name = op == ReduceOp::kSum ? " sum" : " avg";
        RANK_NCCL(ncclReduceScatter(rs_in, rs_ref, n, nccl_type(t), nccl_op, c.nccl, c.stream));
        for (Algorithm a : {Algorithm::kOneShot, Algorithm::kTwoStep}) {
          RANK_CUDA(cudaMemsetAsync(rs_out, 0xff, bytes, c.stream));
          c.comm->reduce_scatter(rs_in, rs_out, n, t, op, c.stream, a);
          failures += compare(c, rs_out, rs_ref, bytes, ("reduce_scatter " + std::string(to_string(a)) + op_name).c_str(), t, n);
        }

        void* ar_ref = dev(c, bytes);
        void* ar_out = dev(c, bytes);
        void* ar_in = dev(c, bytes);
        RANK_NCCL(ncclAllReduce(rs_in, ar_ref, n, nccl_type(t), nccl_op, c.nccl, c.stream));
        for (Algorithm a : {Algorithm::kOneShot, Algorithm::kTwoShot}) {
          const std::string name = "all_reduce " + std::string(to_string(a)) + op_name;
          RANK_CUDA(cudaMemsetAsync(ar_out, 0xff, bytes, c.stream));
          c.comm->all_reduce(rs_in, ar_out, n, t, op, c.stream, a);
          failures += compare(c, ar_out, ar_ref, bytes, name.c_str(), t, n);
          RANK_CUDA(cudaMemcpyAsync(ar_in, rs_in, bytes, cudaMemcpyDeviceToDevice, c.stream));
          c.comm->all_reduce(ar_in, ar_in, n, t, op, c.stream, a);
          failures += compare(c, ar_in, ar_ref, bytes, (name + " in place").c_str(), t, n);
        }
        // In place on the head of a larger buffer, as torch's allreduce does.
        c.comm->all_reduce(rs_in, rs_in, n, t, op, c.stream);
        failures += compare(c, rs_in, ar_ref, bytes, ("all_reduce auto in place" + op_name).c_str(), t, n);
        release(c, ar_in);
        for (void* p : {rs_in, rs_out, rs_ref, ar_ref, ar_out}) release(c, p);
      }
    }
  }
  return failures;
}

int back_to_back_and_graph(Ctx& c) {
  const int rank = c.rank, world = c.world;
  int failures = 0;
  std::mt19937 rng(99u + static_cast<unsigned>(rank));
  const std::size_t n = 32768 + 5, bytes = n * 2, total = bytes * world;
  const DataType t = DataType::kBFloat16;
  void* in = dev(c, bytes);
  void* out = dev(c, total);
  void* ref = dev(c, total);
  void* rs_out = dev(c, bytes);
  for (int i = 0; i < 1000; ++i) {  // reusing buffers, fresh data every 100
    if (i % 100 == 0) {
      auto d = random_ints(rng, n, t);
      RANK_CUDA(cudaMemcpyAsync(in, d.data(), bytes, cudaMemcpyHostToDevice, c.stream));
    }
    c.comm->all_gather(in, out, bytes, c.stream);
  }
  RANK_NCCL(ncclAllGather(in, ref, n, ncclBfloat16, c.nccl, c.stream));
  failures += compare(c, out, ref, total, "1000 back-to-back all_gathers", t, n);

  // Captured once, replayed with new inputs: barrier epochs live on the
  // device, so replays stay in step. Auto algorithms: a small all-gather and
  // reduce-scatter (single kernels), a small all-reduce (one-shot) and a
  // large one (two-shot with barrier kernels).
  const std::size_t big = (std::size_t{4} << 20) + 3;
  void* rs_in = dev(c, total);
  void* rs_ref = dev(c, bytes);
  void* ar = dev(c, big * 2);
  void* ar_ref = dev(c, big * 2);
  auto capture_all = [&] {
    c.comm->all_gather(in, out, bytes, c.stream);
    c.comm->reduce_scatter(rs_in, rs_out, n, t, ReduceOp::kSum, c.stream);
    c.comm->all_reduce(ar, ar, big, t, ReduceOp::kSum, c.stream);
  };
  capture_all();  // eager first: symmetry checks and scratch happen outside the capture
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  RANK_CUDA(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal));
  capture_all();
  RANK_CUDA(cudaStreamEndCapture(c.stream, &graph));
  RANK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 5; ++replay) {
    auto d = random_ints(rng, n, t);
    auto rs_d = random_ints(rng, n * world, t);
    auto ar_d = random_ints(rng, big, t);
    RANK_CUDA(cudaMemcpyAsync(in, d.data(), bytes, cudaMemcpyHostToDevice, c.stream));
    RANK_CUDA(cudaMemcpyAsync(rs_in, rs_d.data(), total, cudaMemcpyHostToDevice, c.stream));
    RANK_CUDA(cudaMemcpyAsync(ar, ar_d.data(), big * 2, cudaMemcpyHostToDevice, c.stream));
    RANK_NCCL(ncclAllReduce(ar, ar_ref, big, ncclBfloat16, ncclSum, c.nccl, c.stream));
    RANK_NCCL(ncclReduceScatter(rs_in, rs_ref, n, ncclBfloat16, ncclSum, c.nccl, c.stream));
    RANK_CUDA(cudaMemsetAsync(out, 0xff, total, c.stream));
    RANK_CUDA(cudaMemsetAsync(rs_out, 0xff, bytes, c.stream));
    RANK_CUDA(cudaGraphLaunch(exec, c.stream));
    RANK_NCCL(ncclAllGather(in, ref, n, ncclBfloat16, c.nccl, c.stream));
    failures += compare(c, out, ref, total, "graph replay of all_gather", t, n);
    failures += compare(c, rs_out, rs_ref, bytes, "graph replay of reduce_scatter", t, n);
    failures += compare(c, ar, ar_ref, big * 2, "graph replay of all_reduce (two-shot)", t, big);
  }
  RANK_CUDA(cudaGraphExecDestroy(exec));
  RANK_CUDA(cudaGraphDestroy(graph));
  for (void* p : {rs_in, rs_ref, ar, ar_ref}) release(c, p);
  for (void* p : {in, out, ref, rs_out}) release(c, p);
  return failures;
}

int bad_input(Ctx& c) {
  const int rank = c.rank;
  int failures = 0;
  // Sizes that differ across ranks: an error naming the ranks, not a result.
  const std::size_t n = rank == 0 ? 1000 : 2000;
  void* in = dev(c, n * 4 * c.world);
  void* out = dev(c, n * 4);
  try {
    c.comm->reduce_scatter(in, out, n, DataType::kFloat32, ReduceOp::kSum, c.stream);
    RANK_EXPECT(false, "mismatched sizes went unnoticed");
  } catch (const logic_error& e) {
    RANK_EXPECT(std::strstr(e.what(), "is not symmetric") && std::strstr(e.what(), "rank 1 has"), "%s", e.what());
  }
  // A buffer outside the heap.
  void* plain = nullptr;
  RANK_CUDA(cudaMalloc(&plain, 4096));
  try {
    c.comm->all_gather(plain, out, 16, c.stream);
    RANK_EXPECT(false, "a buffer outside the heap went unnoticed");
  } catch (const logic_error& e) {
    RANK_EXPECT(std::strstr(e.what(), "not in the symmetric heap"), "%s", e.what());
  }
  RANK_CUDA(cudaFree(plain));
  release(c, in);
  release(c, out);
  return failures;
}

int collectives_rank(int rank, int world, Rendezvous& rv) {
  ncclComm_t nccl = init_nccl(rank, world, rv, kTimeoutSeconds);
  Ctx c{rank, world, nccl, nullptr, &device_allocator(rank), nullptr};
  RANK_CUDA(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  FileStore store(store_dir());
  SymmetricHeap heap(real_driver(), *c.alloc, store, "coll" + std::to_string(world), rank, world);
  Communicator comm(heap, *c.alloc);
  c.comm = &comm;
  int failures = correctness(c);
  failures += back_to_back_and_graph(c);
  failures += bad_input(c);
  RANK_CUDA(cudaStreamSynchronize(c.stream));
  std::printf("[rank %d] %d failures\n", rank, failures);
  RANK_NCCL(ncclCommDestroy(nccl));
  return failures == 0 ? 0 : 1;
}

}  // namespace

TEST(Collectives, MatchNcclOnAllGpus) {
  SYMMPOOL_GPUS_OR_SKIP(gpus, 2);
  store_dir();
  EXPECT_EQ(run_ranks(std::min(gpus, Communicator::kMaxRanks), kTimeoutSeconds, collectives_rank), "");
}

TEST(Collectives, APeerThatStopsComingTimesOutWithAnError) {
  SYMMPOOL_GPUS_OR_SKIP(gpus, 2);
  store_dir();
  std::string result = run_ranks(2, 120, [](int rank, int world, Rendezvous&) {
    int failures = 0;
    RANK_CUDA(cudaSetDevice(rank));
    FileStore store(store_dir());
    SymmetricHeap heap(real_driver(), device_allocator(rank), store, "dies", rank, world);
    Communicator comm(heap, device_allocator(rank));
    if (rank == 1) return 0;  // leaves after setting up
    cudaStream_t s;
    RANK_CUDA(cudaStreamCreate(&s));
    comm.barrier(s);
    RANK_CUDA(cudaStreamSynchronize(s));  // the kernel gives up after its timeout
    try {
      comm.check_errors();
      RANK_EXPECT(false, "a barrier without its peer completed");
    } catch (const timeout_error& e) {
      RANK_EXPECT(std::strstr(e.what(), "for rank 1"), "%s", e.what());
    }
    return failures;
  });
  EXPECT_EQ(result, "");
}

}  // namespace symmpool::test
