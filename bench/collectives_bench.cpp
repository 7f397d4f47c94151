// Collectives against NCCL on the same symmetric, NCCL-registered buffers,
// one process per GPU (forked here; rank 0 reports):
//   AllGather/<impl>/<bytes>, ReduceScatter/<impl>/<bytes>, AllReduce/<impl>/<bytes>
//     bytes: all-gather output, reduce-scatter input, all-reduce buffer
//     (in place, as torch's allreduce);
//     counter busbw in GB/s as nccl-tests defines it; impl: nccl, symmpool
//     (the algorithm table's choice) or symmpool-<algorithm> (one variant),
//     bf16; nccl-fp32 and symmpool-fp32: the same reductions on fp32; for the
//     all-gather also in place (symmpool-in-place..., nccl-in-place: each
//     rank's input its own slice of the output, FSDP2's way) and what its time
//     is made of (peer-copy: the bytes a rank receives pulled by bare copies;
//     barriers-only: the two meetings alone). Each timing starts with the
//     ranks met on the devices (an NCCL all-reduce of one float).
//   AllGatherGraph/..., ReduceScatterGraph/..., AllReduceGraph/...: per-op
//     latency of 20 ops captured in one CUDA graph (all-reduce also at 1 and
//     32 KiB, with symmpool-ll, the low-latency algorithm, up to its limit)
//   Contention/<impl>/<op>/256MiB: 8 bf16 8192^3 matmuls alone and while the
//     collective runs back to back on another stream: matmul slowdown and the
//     collective's time against its standalone time (peer-copy: the all-gather's
//     bytes pulled by bare copies, no meeting: the ceiling; local-copy: only an
//     out-of-place all-gather's own slice, copied within the GPU the way
//     SYMMPOOL_BENCH_LOCAL_COPY names)
// Every rank runs the same list with fixed iteration counts, so ranks stay
// in step. Usage: symmpool_collectives_bench [--ranks N] [benchmark flags]

#include "bench_checks.hpp"
#include "bench_context.hpp"
#include "process_group.hpp"

#include <symmpool/communicator.hpp>
#include <symmpool/detail/scope_exit.hpp>
#include <symmpool/device_allocators.hpp>
#include <symmpool/driver_api.hpp>
#include <symmpool/nccl_registration.hpp>
#include <symmpool/symmetric_group.hpp>

#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using symmpool::Algorithm;
using symmpool::BarrierKind;
using symmpool::Communicator;
using symmpool::DataType;
using symmpool::ReduceOp;

struct Rank {
  int rank = 0, world = 1;
  cudaStream_t stream = nullptr;
  ncclComm_t nccl = nullptr;
  symmpool::CachingAllocator* alloc = nullptr;
  Communicator* comm = nullptr;
  symmpool::SymmetricHeap* heap = nullptr;
  float* start_word = nullptr;  // start_together()'s one float
};
Rank R;

// Ranks start a timing together on the devices, as bench/peers does: an
// NCCL all-reduce of one float just before the start event. Without it a
// single timed call (64 MiB and up) paid the hosts' skew at its first
// meeting, which a bare copy, meeting no one, never pays.
void start_together() {
  BENCH_NCCL(ncclAllReduce(R.start_word, R.start_word, 1, ncclFloat32, ncclSum, R.nccl, R.stream));
}

enum class Op { kAllGather, kReduceScatter, kAllReduce };

const char* op_name(Op op) {
  return op == Op::kAllGather ? "AllGather" : op == Op::kReduceScatter ? "ReduceScatter" : "AllReduce";
}

struct Impl {
  const char* name;
  bool nccl;
  Algorithm algorithm;
  BarrierKind barrier = BarrierKind::kKernel;  // of the copy-engine all-gathers
  DataType type = DataType::kBFloat16;
  // All-gather only: a probe of what slows it beside matmuls instead of a collective.
  enum class Probe {
    kNone,
    kPeerCopy,            // each rank pulls every peer's input, no meeting: the links' and engines' ceiling
    kPeerCopyThenMemset,  // the same, a 16-byte memset (an SM's work) after each, still no peer involved
    kBarriersOnly,        // the all-gather's two barriers (of `barrier`'s kind), no copy
    kStaged,              // barrier, pulls, barrier from public calls, timed per stage (stage_events)
    kLocalCopy,           // only an out-of-place all-gather's own slice, copied within this GPU
  } probe = Probe::kNone;
  // All-gather: each rank's input is its own slice of the output (FSDP2's way).
  bool in_place = false;
};

// Where a staged impl records the end of each of its stages, one entry per
// call, while a Contention run asks for them (null otherwise).
struct StageEvents {
  cudaEvent_t at[4];  // before the first barrier, after it, after the copies, after the second
};
std::vector<StageEvents>* stage_events = nullptr;

ncclDataType_t nccl_type(DataType t) {
  return t == DataType::kFloat32 ? ncclFloat32 : t == DataType::kFloat16 ? ncclFloat16 : ncclBfloat16;
}
constexpr Impl kNccl{"nccl", true, Algorithm::kAuto};
constexpr Impl kSymmpool{"symmpool", false, Algorithm::kAuto};

Impl with_probe(const char* name, Impl::Probe kind, BarrierKind barrier = BarrierKind::kKernel) {
  Impl impl{name, false, Algorithm::kAuto, barrier};
  impl.probe = kind;
  return impl;
}

Impl in_place(Impl impl) {
  impl.in_place = true;
  return impl;
}

// Variants measured next to the table's choice, so the table can be checked.
// The all-gather's also show what its time is made of: in place as FSDP2
// calls it (each rank's input its own slice of the output), the bare copies
// alone (the ceiling) and the two meetings alone.
std::vector<Impl> variants(Op op) {
  if (op == Op::kAllGather)
    return {{"symmpool-ce-pull", false, Algorithm::kCopyEnginePull},
            {"symmpool-ce-push", false, Algorithm::kCopyEnginePush},
            {"symmpool-ce-push-streamops", false, Algorithm::kCopyEnginePush, BarrierKind::kStreamOps},
            {"symmpool-kernel", false, Algorithm::kKernel},
            in_place({"symmpool-in-place", false, Algorithm::kAuto}),
            in_place({"nccl-in-place", true, Algorithm::kAuto}),
            in_place({"symmpool-in-place-streamops", false, Algorithm::kAuto, BarrierKind::kStreamOps}),
            in_place({"symmpool-in-place-kernel", false, Algorithm::kKernel}),
            in_place({"symmpool-in-place-ce-pull", false, Algorithm::kCopyEnginePull}),
            with_probe("peer-copy", Impl::Probe::kPeerCopy),
            with_probe("barriers-only", Impl::Probe::kBarriersOnly),
            with_probe("barriers-only-streamops", Impl::Probe::kBarriersOnly, BarrierKind::kStreamOps)};
  if (op == Op::kReduceScatter)
    return {{"symmpool-1shot", false, Algorithm::kOneShot},
            {"symmpool-2step", false, Algorithm::kTwoStep},
            {"nccl-fp32", true, Algorithm::kAuto, BarrierKind::kKernel, DataType::kFloat32},
            {"symmpool-fp32", false, Algorithm::kAuto, BarrierKind::kKernel, DataType::kFloat32}};
  return {{"symmpool-1shot", false, Algorithm::kOneShot},
          {"symmpool-2shot", false, Algorithm::kTwoShot},
          {"symmpool-2step", false, Algorithm::kTwoStep},
          {"nccl-fp32", true, Algorithm::kAuto, BarrierKind::kKernel, DataType::kFloat32},
          {"symmpool-fp32", false, Algorithm::kAuto, BarrierKind::kKernel, DataType::kFloat32}};
}

// nccl-tests' bus bandwidth factors.
double bus_factor(Op op, int n) {
  return op == Op::kAllReduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

struct Buffers {
  void* in;
  void* out;
  std::size_t count;  // elements per rank (AG, RS) or in total (AR)
  // What release frees: an in-place all-gather's input is a slice of its
  // output, an all-reduce's output is its input.
  std::vector<void*> owned;
};

Buffers make_buffers(Op op, std::size_t bytes, std::size_t es, bool in_place = false) {
  const std::size_t elems = bytes / es;
  Buffers b{};
  auto s = reinterpret_cast<CUstream>(R.stream);
  auto allocate = [&](std::size_t n) { return b.owned.emplace_back(R.alloc->allocate(n, s)); };
  if (op == Op::kAllGather) {
    b.count = elems / R.world;
    b.out = allocate(bytes);
    b.in = in_place ? static_cast<char*>(b.out) + static_cast<std::size_t>(R.rank) * b.count * es
                    : allocate(b.count * es);
  } else if (op == Op::kReduceScatter) {
    b.count = elems / R.world;
    b.in = allocate(bytes);
    b.out = allocate(b.count * es);
  } else {  // in place, as torch's allreduce
    b.count = elems;
    b.in = allocate(bytes);
    b.out = b.in;
  }
  BENCH_CUDA(cudaMemsetAsync(b.in, 1, op == Op::kAllGather ? b.count * es : bytes, R.stream));
  return b;
}

// An out-of-place all-gather's own slice, input to output within this GPU,
// made the way SYMMPOOL_BENCH_LOCAL_COPY names: memcpy (cudaMemcpyAsync, the
// default), overlap-hint (cudaMemcpyBatchAsync asking to overlap compute),
// 2d (cudaMemcpy2DAsync, 64 KiB rows) or peer (cudaMemcpyPeerAsync to itself).
void copy_own_slice(const Buffers& b, std::size_t chunk) {
  static const std::string how = [] {
    const char* e = std::getenv("SYMMPOOL_BENCH_LOCAL_COPY");
    return std::string(e ? e : "memcpy");
  }();
  void* dst = static_cast<char*>(b.out) + static_cast<std::size_t>(R.rank) * chunk;
  if (how == "memcpy") {
    BENCH_CUDA(cudaMemcpyAsync(dst, b.in, chunk, cudaMemcpyDeviceToDevice, R.stream));
  } else if (how == "overlap-hint") {
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    void* dsts[1] = {dst};
    const void* srcs[1] = {b.in};
    std::size_t sizes[1] = {chunk}, first[1] = {0};
    BENCH_CUDA(cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &attr, first, 1, R.stream));
  } else if (how == "2d") {
    constexpr std::size_t row = 64 << 10;
    BENCH_CHECK(chunk % row == 0, true);
    BENCH_CUDA(cudaMemcpy2DAsync(dst, row, b.in, row, row, chunk / row, cudaMemcpyDeviceToDevice, R.stream));
  } else if (how == "peer") {
    int device = 0;
    BENCH_CUDA(cudaGetDevice(&device));
    BENCH_CUDA(cudaMemcpyPeerAsync(dst, device, b.in, device, chunk, R.stream));
  } else {
    std::fprintf(stderr, "SYMMPOOL_BENCH_LOCAL_COPY must be memcpy, overlap-hint, 2d or peer, got '%s'\n",
                 how.c_str());
    std::exit(1);
  }
}

// All-gather's bytes from the peers: each peer's input into its slice of our
// output, by bare copies on our stream (no meeting).
void pull_from_peers(const Buffers& b, std::size_t chunk) {
  for (int k = 1; k < R.world; ++k) {
    const int p = (R.rank + k) % R.world;
    BENCH_CUDA(cudaMemcpyAsync(static_cast<char*>(b.out) + p * chunk, R.heap->peer_ptr(b.in, p, chunk), chunk,
                               cudaMemcpyDeviceToDevice, R.stream));
  }
}

void run_once(Op op, const Impl& impl, const Buffers& b) {
  using Probe = Impl::Probe;
  const std::size_t es = symmpool::element_size(impl.type);
  if (impl.probe != Probe::kNone) BENCH_CHECK(op == Op::kAllGather, true);
  if (impl.probe == Probe::kPeerCopy || impl.probe == Probe::kPeerCopyThenMemset) {
    pull_from_peers(b, b.count * es);
    if (impl.probe == Probe::kPeerCopyThenMemset) BENCH_CUDA(cudaMemsetAsync(b.out, 0, 16, R.stream));
    return;
  }
  if (impl.probe == Probe::kLocalCopy) {
    copy_own_slice(b, b.count * es);
    return;
  }
  if (impl.probe == Probe::kStaged) {
    auto mark = [&](int i) {
      if (stage_events) BENCH_CUDA(cudaEventRecord(stage_events->back().at[i], R.stream));
    };
    if (stage_events) {
      stage_events->emplace_back();
      for (cudaEvent_t& e : stage_events->back().at) BENCH_CUDA(cudaEventCreate(&e));
    }
    mark(0);
    R.comm->barrier(R.stream);
    mark(1);
    pull_from_peers(b, b.count * es);
    mark(2);
    R.comm->barrier(R.stream);
    mark(3);
    return;
  }
  if (impl.probe == Probe::kBarriersOnly) {
    R.comm->barrier(R.stream, impl.barrier);
    R.comm->barrier(R.stream, impl.barrier);
    return;
  }
  if (impl.nccl) {
    const ncclDataType_t t = nccl_type(impl.type);
    if (op == Op::kAllGather) BENCH_NCCL(ncclAllGather(b.in, b.out, b.count, t, R.nccl, R.stream));
    if (op == Op::kReduceScatter)
      BENCH_NCCL(ncclReduceScatter(b.in, b.out, b.count, t, ncclSum, R.nccl, R.stream));
    if (op == Op::kAllReduce) BENCH_NCCL(ncclAllReduce(b.in, b.out, b.count, t, ncclSum, R.nccl, R.stream));
    return;
  }
  const Algorithm a = impl.algorithm;
  if (op == Op::kAllGather) R.comm->all_gather(b.in, b.out, b.count * es, R.stream, a, impl.barrier);
  if (op == Op::kReduceScatter)
    R.comm->reduce_scatter(b.in, b.out, b.count, impl.type, ReduceOp::kSum, R.stream, a);
  if (op == Op::kAllReduce) R.comm->all_reduce(b.in, b.out, b.count, impl.type, ReduceOp::kSum, R.stream, a);
}

void release(const Buffers& b) {
  BENCH_CUDA(cudaStreamSynchronize(R.stream));
  for (void* p : b.owned) R.alloc->deallocate(p, reinterpret_cast<CUstream>(R.stream));
}

// Times `reps` ops between two events per iteration.
void Bandwidth(benchmark::State& state, Op op, Impl impl, std::size_t bytes, int reps) {
  Buffers b = make_buffers(op, bytes, symmpool::element_size(impl.type), impl.in_place);
  for (int i = 0; i < 3; ++i) run_once(op, impl, b);  // warm up (and symmetry checks)
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  double seconds = 0;
  for (auto _ : state) {
    start_together();
    BENCH_CUDA(cudaEventRecord(start, R.stream));
    for (int i = 0; i < reps; ++i) run_once(op, impl, b);
    BENCH_CUDA(cudaEventRecord(stop, R.stream));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms / 1e3 / reps);
    seconds += ms / 1e3 / reps;
  }
  R.comm->check_errors();
  const double per_op = seconds / static_cast<double>(state.iterations());
  state.counters["busbw_GBps"] = static_cast<double>(bytes) * bus_factor(op, R.world) / per_op / 1e9;
  state.counters["bytes"] = static_cast<double>(bytes);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  release(b);
}

// Latency inside a CUDA graph of `reps` ops.
void GraphLatency(benchmark::State& state, Op op, Impl impl, std::size_t bytes) {
  constexpr int reps = 20;
  Buffers b = make_buffers(op, bytes, symmpool::element_size(impl.type), impl.in_place);
  run_once(op, impl, b);  // symmetry checks and heap sync happen outside the capture
  BENCH_CUDA(cudaStreamSynchronize(R.stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaStreamBeginCapture(R.stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) run_once(op, impl, b);
  BENCH_CUDA(cudaStreamEndCapture(R.stream, &graph));
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  BENCH_CUDA(cudaGraphLaunch(exec, R.stream));  // warm up
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  for (auto _ : state) {
    start_together();
    BENCH_CUDA(cudaEventRecord(start, R.stream));
    BENCH_CUDA(cudaGraphLaunch(exec, R.stream));
    BENCH_CUDA(cudaEventRecord(stop, R.stream));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms / 1e3 / reps);
  }
  R.comm->check_errors();
  state.counters["bytes"] = static_cast<double>(bytes);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  release(b);
}

// Matmuls on one stream while the collective loops on another.
void Contention(benchmark::State& state, Op op, Impl impl) {
  constexpr int n = 8192, matmuls = 8;
  constexpr std::size_t bytes = std::size_t{256} << 20;
  cudaStream_t compute;
  BENCH_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  cublasHandle_t blas;
  BENCH_CHECK(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  BENCH_CHECK(cublasSetStream(blas, compute), CUBLAS_STATUS_SUCCESS);
  // SYMMPOOL_BENCH_SM_CARVEOUT=N leaves N SMs to the collective (cuBLAS's SM
  // count target, as torch's _set_sm_carveout_experimental does), so that a
  // meeting's kernel need not wait for a matmul block to end.
  const char* carveout_env = std::getenv("SYMMPOOL_BENCH_SM_CARVEOUT");
  const int carveout = carveout_env ? std::atoi(carveout_env) : 0;
  if (carveout > 0) {
    int device = 0, sms = 0;
    BENCH_CUDA(cudaGetDevice(&device));
    BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    BENCH_CHECK(cublasSetSmCountTarget(blas, sms - carveout), CUBLAS_STATUS_SUCCESS);
  }
  void *a, *b, *c;
  const std::size_t matrix = std::size_t{n} * n * 2;
  BENCH_CUDA(cudaMalloc(&a, matrix));
  BENCH_CUDA(cudaMalloc(&b, matrix));
  BENCH_CUDA(cudaMalloc(&c, matrix));
  {  // random bf16 in [-1, 1): never time matmuls on zeros or constants
    std::mt19937 rng(7u + static_cast<unsigned>(R.rank));
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    std::vector<std::uint16_t> host(std::size_t{n} * n);
    for (auto& h : host) {
      float f = dist(rng);
      std::uint32_t bits;
      std::memcpy(&bits, &f, 4);
      h = static_cast<std::uint16_t>(bits >> 16);
    }
    BENCH_CUDA(cudaMemcpy(a, host.data(), matrix, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(b, host.data(), matrix, cudaMemcpyHostToDevice));
  }
  const float one = 1.f, zero = 0.f;
  auto run_matmuls = [&] {
    for (int i = 0; i < matmuls; ++i)
      BENCH_CHECK(
          cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
                       &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          CUBLAS_STATUS_SUCCESS);
  };
  Buffers buf = make_buffers(op, bytes, symmpool::element_size(impl.type), impl.in_place);
  // The probes that pull by hand first publish the buffers (a heap sync).
  if (impl.probe != Impl::Probe::kNone && impl.probe != Impl::Probe::kBarriersOnly)
    run_once(op, kSymmpool, buf);
  run_once(op, impl, buf);
  run_matmuls();
  BENCH_CUDA(cudaDeviceSynchronize());

  // Fixed, not derived from this rank's timings: every rank must run the
  // same number of collectives. 24 x 256 MiB spans the 8 matmuls on H200.
  constexpr int comms = 24;
  // Each timed run holds its streams on one device word until all of its
  // work is enqueued: the host's time to enqueue 24 collectives must not
  // count as matmul time, nor the matmuls' launch gap as idle.
  cudaStream_t opener;
  BENCH_CUDA(cudaStreamCreateWithFlags(&opener, cudaStreamNonBlocking));
  std::uint32_t* gate = nullptr;
  BENCH_CUDA(cudaMalloc(&gate, sizeof(std::uint32_t)));
  BENCH_CUDA(cudaMemset(gate, 0, sizeof(std::uint32_t)));
  const symmpool::DriverApi& drv = symmpool::real_driver();
  std::uint32_t epoch = 0;
  struct Times {
    float matmul_ms = 0, comm_ms = 0;
  };
  auto run_gated = [&](bool with_matmuls, bool with_comms) {
    ++epoch;
    cudaEvent_t m0, m1, c0, c1;
    for (cudaEvent_t* e : {&m0, &m1, &c0, &c1}) BENCH_CUDA(cudaEventCreate(e));
    for (cudaStream_t s : {R.stream, compute})
      BENCH_CHECK(drv.cuStreamWaitValue32(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(gate),
                                          epoch, CU_STREAM_WAIT_VALUE_GEQ),
                  CUDA_SUCCESS);
    BENCH_CUDA(cudaEventRecord(c0, R.stream));
    BENCH_CUDA(cudaEventRecord(m0, compute));
    if (with_comms)
      for (int i = 0; i < comms; ++i) run_once(op, impl, buf);
    if (with_matmuls) run_matmuls();
    BENCH_CUDA(cudaEventRecord(c1, R.stream));
    BENCH_CUDA(cudaEventRecord(m1, compute));
    BENCH_CHECK(
        drv.cuStreamWriteValue32(reinterpret_cast<CUstream>(opener), reinterpret_cast<CUdeviceptr>(gate),
                                 epoch, CU_STREAM_WRITE_VALUE_DEFAULT),
        CUDA_SUCCESS);
    BENCH_CUDA(cudaEventSynchronize(m1));
    BENCH_CUDA(cudaEventSynchronize(c1));
    Times t;
    BENCH_CUDA(cudaEventElapsedTime(&t.matmul_ms, m0, m1));
    BENCH_CUDA(cudaEventElapsedTime(&t.comm_ms, c0, c1));
    t.comm_ms /= comms;
    for (cudaEvent_t e : {m0, m1, c0, c1}) cudaEventDestroy(e);
    return t;
  };
  const float matmul_alone = run_gated(true, false).matmul_ms;
  // The peers' matmuls may still run: meet them first, or the standalone
  // time would include waiting for them.
  run_once(op, impl, buf);
  BENCH_CUDA(cudaStreamSynchronize(R.stream));
  const float comm_alone = run_gated(false, true).comm_ms;
  double matmul_ms = 0, comm_ms = 0;
  for (auto _ : state) {
    const Times t = run_gated(true, true);
    matmul_ms += t.matmul_ms;
    comm_ms += t.comm_ms;
    state.SetIterationTime(t.matmul_ms / 1e3);
  }
  if (impl.probe == Impl::Probe::kStaged) {
    // Each stage's mean time over the first 8 calls (all of them beside the
    // matmuls when those run), alone and beside the matmuls.
    for (const bool with_matmuls : {false, true}) {
      std::vector<StageEvents> events;
      stage_events = &events;
      run_gated(with_matmuls, true);
      stage_events = nullptr;
      BENCH_CUDA(cudaDeviceSynchronize());
      double stage_ms[3] = {};
      const std::size_t first = std::min<std::size_t>(8, events.size());
      for (std::size_t i = 0; i < first; ++i)
        for (int k = 0; k < 3; ++k) {
          float ms = 0;
          BENCH_CUDA(cudaEventElapsedTime(&ms, events[i].at[k], events[i].at[k + 1]));
          stage_ms[k] += ms / static_cast<double>(first);
        }
      for (StageEvents& e : events)
        for (cudaEvent_t ev : e.at) cudaEventDestroy(ev);
      const std::string when = with_matmuls ? "with_matmuls_" : "alone_";
      state.counters[when + "barrier1_us"] = stage_ms[0] * 1e3;
      state.counters[when + "copy_us"] = stage_ms[1] * 1e3;
      state.counters[when + "barrier2_us"] = stage_ms[2] * 1e3;
    }
  }
  BENCH_CUDA(cudaFree(gate));
  BENCH_CUDA(cudaStreamDestroy(opener));
  R.comm->check_errors();
  const double iters = static_cast<double>(state.iterations());
  state.counters["matmul_alone_ms"] = matmul_alone;
  state.counters["matmul_ms"] = matmul_ms / iters;
  state.counters["matmul_slowdown_pct"] = 100.0 * (matmul_ms / iters / matmul_alone - 1.0);
  state.counters["sm_carveout"] = carveout;
  state.counters["comm_alone_us"] = comm_alone * 1e3;
  state.counters["comm_us"] = comm_ms / iters * 1e3;
  state.counters["comm_vs_alone"] = comm_ms / iters / comm_alone;
  release(buf);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cublasDestroy(blas);
  cudaStreamDestroy(compute);
}

void register_all() {
  constexpr std::size_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;
  auto name = [](std::size_t bytes) {
    return bytes >= GiB   ? std::to_string(bytes / GiB) + "GiB"
           : bytes >= MiB ? std::to_string(bytes / MiB) + "MiB"
                          : std::to_string(bytes / KiB) + "KiB";
  };
  for (Op op : {Op::kAllGather, Op::kReduceScatter, Op::kAllReduce}) {
    std::vector<Impl> impls = {kSymmpool, kNccl};
    for (const Impl& v : variants(op)) impls.push_back(v);
    for (std::size_t bytes = 64 * KiB; bytes <= GiB; bytes *= 4) {
      const int reps = bytes <= 16 * MiB ? 10 : 1;
      const int iters = bytes <= 16 * MiB ? 30 : 10;
      for (const Impl& impl : impls) {
        std::string n = std::string(op_name(op)) + "/" + impl.name + "/" + name(bytes);
        benchmark::RegisterBenchmark(n.c_str(), Bandwidth, op, impl, bytes, reps)
            ->UseManualTime()
            ->Iterations(iters)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  const std::vector<std::pair<Op, Impl>> contention = {
      {Op::kAllGather, kNccl},
      {Op::kAllGather, kSymmpool},
      {Op::kAllGather, {"symmpool-ce-push", false, Algorithm::kCopyEnginePush}},
      {Op::kAllGather,
       {"symmpool-ce-push-streamops", false, Algorithm::kCopyEnginePush, BarrierKind::kStreamOps}},
      {Op::kAllGather, {"symmpool-ce-pull", false, Algorithm::kCopyEnginePull}},
      {Op::kAllGather,
       {"symmpool-ce-pull-streamops", false, Algorithm::kCopyEnginePull, BarrierKind::kStreamOps}},
      // The ceiling: the same bytes pulled by the copy engines with no meeting at all.
      {Op::kAllGather, with_probe("peer-copy", Impl::Probe::kPeerCopy)},
      {Op::kAllGather, with_probe("peer-copy-then-memset", Impl::Probe::kPeerCopyThenMemset)},
      {Op::kAllGather, with_probe("barriers-only", Impl::Probe::kBarriersOnly)},
      {Op::kAllGather,
       with_probe("barriers-only-streamops", Impl::Probe::kBarriersOnly, BarrierKind::kStreamOps)},
      {Op::kAllGather, with_probe("barrier-copy-barrier", Impl::Probe::kStaged)},
      {Op::kAllGather, with_probe("local-copy", Impl::Probe::kLocalCopy)},
      {Op::kAllGather, in_place({"nccl-in-place", true, Algorithm::kAuto})},
      {Op::kAllGather, in_place({"symmpool-in-place", false, Algorithm::kAuto})},
      {Op::kAllGather,
       in_place({"symmpool-in-place-streamops", false, Algorithm::kAuto, BarrierKind::kStreamOps})},
      {Op::kReduceScatter, kNccl},
      {Op::kReduceScatter, kSymmpool},
      {Op::kReduceScatter, {"symmpool-2step", false, Algorithm::kTwoStep}},
      {Op::kAllReduce, {"symmpool-2shot", false, Algorithm::kTwoShot}},
      {Op::kAllReduce, {"symmpool-2step", false, Algorithm::kTwoStep}}};
  for (const auto& [op, impl] : contention) {
    std::string n = std::string("Contention/") + impl.name + "/" + op_name(op) + "/256MiB";
    benchmark::RegisterBenchmark(n.c_str(), Contention, op, impl)
        ->UseManualTime()
        ->Iterations(5)
        ->Unit(benchmark::kMillisecond);
  }
  for (Op op : {Op::kAllGather, Op::kReduceScatter, Op::kAllReduce}) {
    std::vector<std::size_t> sizes = {8 * KiB, 64 * KiB, 512 * KiB, 4 * MiB, 8 * MiB};
    if (op == Op::kAllReduce) sizes.insert(sizes.begin(), {1 * KiB, 32 * KiB});
    for (std::size_t bytes : sizes) {
      std::vector<Impl> impls = {kSymmpool, kNccl};
      for (const Impl& v : variants(op)) impls.push_back(v);
      // Low-latency takes small messages only (Communicator::kLowLatencyMaxBytes).
      if (op == Op::kAllReduce && bytes <= Communicator::kLowLatencyMaxBytes)
        impls.push_back({"symmpool-ll", false, Algorithm::kLowLatency});
      for (const Impl& impl : impls) {
        std::string n = std::string(op_name(op)) + "Graph/" + impl.name + "/" + name(bytes);
        benchmark::RegisterBenchmark(n.c_str(), GraphLatency, op, impl, bytes)
            ->UseManualTime()
            ->Iterations(30)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  int ranks = symmpool::test::count_gpus_in_child();
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--ranks") == 0 && i + 1 < argc) {
      ranks = std::atoi(argv[++i]);
      continue;
    }
    args.push_back(argv[i]);
  }
  if (ranks < 2) {
    std::fprintf(stderr, "symmpool_collectives_bench: needs 2 or more GPUs, found %d\n", ranks);
    return 0;
  }
  ranks = std::min(ranks, Communicator::kMaxRanks);
  // Before the fork: every rank records the parent's answer.
  symmpool::bench::require_clean_tree("symmpool_collectives_bench");
  char dir_template[] = "/tmp/symmpool-bench-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  std::string failures =
      symmpool::test::run_ranks(ranks, 3000, [&](int rank, int world, symmpool::test::Rendezvous& rv) {
        R.rank = rank;
        R.world = world;
        R.nccl = symmpool::test::init_nccl(rank, world, rv, 120);
        // SYMMPOOL_BENCH_HIGH_PRIORITY=1: the collectives' stream at the highest
        // priority, as FSDP2 makes its all-gather and reduce-scatter streams.
        int lowest = 0, highest = 0;
        BENCH_CUDA(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
        const bool high = std::getenv("SYMMPOOL_BENCH_HIGH_PRIORITY") != nullptr;
        BENCH_CUDA(cudaStreamCreateWithPriority(&R.stream, cudaStreamNonBlocking, high ? highest : lowest));
        R.alloc = &symmpool::device_allocator(rank);
        symmpool::NcclRegistrationHook hook(R.nccl);  // NCCL gets registered buffers too
        R.alloc->add_observer(&hook, true);
        symmpool::detail::ScopeExit detach([&] { R.alloc->remove_observer(&hook, true); });
        symmpool::FileStore store(dir);
        symmpool::SymmetricGroup group(symmpool::real_driver(), *R.alloc, store, "bench", rank, world);
        R.comm = &group.communicator();
        R.heap = &group.heap();
        BENCH_CUDA(cudaMalloc(&R.start_word, sizeof(float)));
        BENCH_CUDA(cudaMemset(R.start_word, 0, sizeof(float)));

        std::vector<char*> my_args = args;
        if (rank != 0)  // only rank 0 writes files
          my_args.erase(std::remove_if(my_args.begin() + 1, my_args.end(),
                                       [](char* a) { return std::strncmp(a, "--benchmark_out", 15) == 0; }),
                        my_args.end());
        int my_argc = static_cast<int>(my_args.size());
        benchmark::Initialize(&my_argc, my_args.data());
        symmpool::bench::add_gpu_context();
        benchmark::AddCustomContext("ranks", std::to_string(world));
        register_all();
        if (rank == 0) {
          benchmark::RunSpecifiedBenchmarks();
        } else {
          SilentReporter silent;
          benchmark::RunSpecifiedBenchmarks(&silent);
        }
        benchmark::Shutdown();
        BENCH_CUDA(cudaStreamSynchronize(R.stream));
        BENCH_CUDA(cudaFree(R.start_word));
        return 0;
      });
  if (!failures.empty()) {
    std::fprintf(stderr, "symmpool_collectives_bench: %s\n", failures.c_str());
    return 1;
  }
  return 0;
}
