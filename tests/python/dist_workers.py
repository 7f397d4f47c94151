"""Bodies of the multi-GPU tests of collectives, graphs, FSDP2 and timeouts,
one call per rank (see launch.py); group layouts: dist_group_layouts.py."""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from dist_common import expect_error, host_barrier, init_group, poisoned, ranks_share_gpu, set_collectives_mode


def symm_backend_matches_nccl(rank: int, world: int, collectives: str) -> None:
    """The "symm" backend's collectives, on symm buffers and on plain ones,
    equal NCCL's on the same data, bit for bit. Every reference comes from a
    group of NCCL's own, never from the "symm" default group: there a small
    plain all-reduce runs symmpool's low-latency kernel (it reads no peer's
    buffer, so any memory will do), and a reference through it would be
    symmpool checked against itself."""
    # The "symm" backend is a ProcessGroupNCCL: its plain tensors, and every
    # call with collectives "0", go to NCCL, which refuses two ranks on one
    # GPU; the gloo/CPU references of a shared GPU would not help here.
    assert not ranks_share_gpu(), "symm_backend_matches_nccl needs one GPU per rank (launch.run_workers)"
    set_collectives_mode(collectives)
    import symmpool

    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    backend = dist.group.WORLD._get_backend(device)
    assert backend.supports_tensor_alloc(device)
    on_default = backend.allocate_tensor(1001, dtype=torch.bfloat16, device=device)  # before any collective
    assert on_default.numel() == 1001 and on_default.dtype == torch.bfloat16
    # With symmpool's collectives off, the default stream's requests (FSDP2's
    # reduce-scatter input) come from PyTorch's cache; other streams' from symmpool.
    assert symmpool.owns(on_default) == (collectives != "0"), collectives
    del on_default
    nccl = dist.new_group(backend="nccl")  # the references: plain NCCL on plain tensors
    if collectives == "0":
        with torch.cuda.stream(torch.cuda.Stream(device)):
            _symm_backend_matches_nccl_on_the_current_stream(rank, world, collectives, device, backend, nccl)
    else:
        _symm_backend_matches_nccl_on_the_current_stream(rank, world, collectives, device, backend, nccl)
    dist.destroy_process_group()


def _symm_backend_matches_nccl_on_the_current_stream(rank, world, collectives, device, backend, nccl) -> None:
    import symmpool

    first = backend.allocate_tensor(1001, dtype=torch.bfloat16, device=device)
    assert symmpool.owns(first) and first.numel() == 1001 and first.dtype == torch.bfloat16

    gen = torch.Generator().manual_seed(1234 + rank)

    def rand(n, dtype):  # random small integers: exact in any summation order
        return torch.randint(-8, 9, (n,), generator=gen).to(dtype).to(device)

    def nan(n, dtype):
        return torch.full((n,), float("nan"), dtype=dtype, device=device)

    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for n in (1, 3, 1001, 65537, (1 << 20) + 7):
            where = f"{dtype} n={n} rank={rank}"
            x = rand(n, dtype)
            expected = nan(n * world, dtype)
            dist.all_gather_into_tensor(expected, x, group=nccl)
            # A plain tensor on the "symm" group: NCCL, after the router's check.
            plain_out = nan(n * world, dtype)
            dist.all_gather_into_tensor(plain_out, x)
            assert torch.equal(plain_out, expected), f"plain tensors' all-gather differs: {where}"
            symm_in = backend.allocate_tensor(n, dtype=dtype, device=device)
            symm_in.copy_(x)
            symm_out = poisoned(backend, n * world, dtype, device)
            dist.all_gather_into_tensor(symm_out, symm_in)
            assert torch.equal(symm_out, expected), f"all-gather differs: {where}"
            assert not symm_out.isnan().any(), f"all-gather left poison: {where}"
            # In place, as FSDP2 does it: the input is this rank's slice of the output.
            inplace = poisoned(backend, n * world, dtype, device)
            inplace[rank * n:(rank + 1) * n].copy_(x)
            dist.all_gather_into_tensor(inplace, inplace[rank * n:(rank + 1) * n])
            assert torch.equal(inplace, expected), f"in-place all-gather differs: {where}"

            for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                y = rand(n * world, dtype)
                expected_rs = nan(n, dtype)
                dist.reduce_scatter_tensor(expected_rs, y, op=op, group=nccl)
                plain_rs = nan(n, dtype)
                dist.reduce_scatter_tensor(plain_rs, y, op=op)
                assert torch.equal(plain_rs, expected_rs), f"plain tensors' reduce-scatter {op} differs: {where}"
                symm_y = backend.allocate_tensor(n * world, dtype=dtype, device=device)
                symm_y.copy_(y)
                symm_rs = poisoned(backend, n, dtype, device)
                dist.reduce_scatter_tensor(symm_rs, symm_y, op=op)
                assert torch.equal(symm_rs, expected_rs), f"reduce-scatter {op} differs: {where}"

            z = rand(n, dtype)
            expected_z = z.clone()
            dist.all_reduce(expected_z, group=nccl)
            symm_z = backend.allocate_tensor(n, dtype=dtype, device=device)
            symm_z.copy_(z)
            # A plain tensor on the "symm" group: low-latency (symmpool) when
            # small, else NCCL after the router's check.
            dist.all_reduce(z)
            dist.all_reduce(symm_z)
            assert torch.equal(z, expected_z), f"plain tensors' all-reduce differs: {where}"
            assert torch.equal(symm_z, expected_z), f"all-reduce differs: {where}"

    stats = symmpool.memory_stats(device)
    assert stats["nccl_registered_segments"] == stats["segments"]["current"] > 0, stats

    # Steady state: buffers come from the cache, so no new registration, and
    # their symmetry verdicts from the verdict cache, so no host round trip.
    after_first = None
    for step in range(100):
        inp = backend.allocate_tensor(8 << 20, dtype=torch.bfloat16, device=device)
        out = backend.allocate_tensor((8 << 20) * world, dtype=torch.bfloat16, device=device)
        dist.all_gather_into_tensor(out, inp)
        del inp, out
        if step == 0:
            after_first = symmpool.memory_stats(device)
    torch.cuda.synchronize()
    final = symmpool.memory_stats(device)
    for key in ("nccl_registrations", "heap_exchanges"):
        assert final[key] == after_first[key], f"{key} grew from {after_first[key]} to {final[key]} over 100 steps"
    print(f"[rank {rank}] registrations flat at {final['nccl_registrations']}, heap exchanges at "
          f"{final['heap_exchanges']} over 100 steps", flush=True)
    stats = symmpool.memory_stats(device)
    if collectives == "always" or (collectives == "table" and world in symmpool._C.table_world_sizes()):
        # symm buffers ran on symmpool; plain ones went to NCCL after the check
        assert stats["symm_collectives"] > 0 and stats["nccl_fallbacks"] > 0, stats
    elif collectives == "0":
        assert stats["symm_collectives"] == 0 and stats["nccl_fallbacks"] == 0, stats


def symm_tensor_freed_in_a_capture_stays_with_the_graph(rank: int, world: int) -> None:
    """A symm tensor allocated and freed inside a CUDA graph capture keeps its
    memory for the graph. Before, the block went back to the cache: the next
    allocation on that stream got it, and every replay overwrote it."""
    import symmpool

    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    backend = dist.group.WORLD._get_backend(device)
    n = 1 << 20
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):  # a cached block for the capture (no new segment inside it)
        warm = backend.allocate_tensor(n, dtype=torch.float32, device=device)
        del warm
    source = torch.full((n,), 7.0, device=device)
    torch.cuda.synchronize()
    held_before = symmpool.memory_stats(device)["graph_held_bytes"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        scratch = backend.allocate_tensor(n, dtype=torch.float32, device=device)
        scratch_ptr = scratch.data_ptr()
        scratch.copy_(source)  # every replay writes here
        del scratch
    with torch.cuda.stream(stream):
        eager = backend.allocate_tensor(n, dtype=torch.float32, device=device)
        eager.fill_(1.0)
        graph.replay()
    torch.cuda.synchronize()
    assert eager.data_ptr() != scratch_ptr, "the captured block was handed out again"
    assert torch.all(eager == 1.0), "a replay overwrote a tensor allocated after the capture"
    assert symmpool.memory_stats(device)["graph_held_bytes"] - held_before == 4 * n
    del graph, eager
    host_barrier()
    dist.destroy_process_group()


def symm_collectives_replay_in_a_cuda_graph(rank: int, world: int, collectives: str,
                                           warm_up: bool) -> None:
    """All-gather, reduce-scatter and all-reduce on symm tensors, captured once
    with torch.cuda.graph and replayed on fresh random data: every replay
    matches NCCL on plain tensors and overwrites the poisoned outputs. Without
    `warm_up` the capture is the buffers' first use."""
    set_collectives_mode(collectives)
    import symmpool

    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    backend = dist.group.WORLD._get_backend(device)
    n, dtype = 65537, torch.bfloat16  # odd: not a multiple of 16 bytes
    gen = torch.Generator().manual_seed(99 + rank)

    def rand(count):  # random small integers: exact in any summation order
        return torch.randint(-8, 9, (count,), generator=gen).to(dtype).to(device)

    ag_in = backend.allocate_tensor(n, dtype=dtype, device=device)
    ag_out = poisoned(backend, n * world, dtype, device)
    rs_in = backend.allocate_tensor(n * world, dtype=dtype, device=device)
    rs_out = poisoned(backend, n, dtype, device)
    ar = backend.allocate_tensor(n, dtype=dtype, device=device)

    def collectives_step():
        dist.all_gather_into_tensor(ag_out, ag_in)
        dist.reduce_scatter_tensor(rs_out, rs_in)
        dist.all_reduce(ar)

    if warm_up:  # outside the capture: symmetry checks and heap syncs happen here
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            collectives_step()
        torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    routed_before = symmpool.memory_stats(device)["symm_collectives"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        collectives_step()
    routed_in_capture = symmpool.memory_stats(device)["symm_collectives"] - routed_before
    if collectives == "always":
        assert routed_in_capture == 3, f"{routed_in_capture} of 3 captured collectives ran on symmpool"
    else:
        assert routed_in_capture == 0, f"{routed_in_capture} captured collectives ran on symmpool"

    for replay in range(5):
        x, y, z = rand(n), rand(n * world), rand(n)
        ag_in.copy_(x)
        rs_in.copy_(y)
        ar.copy_(z)
        ag_out.fill_(float("nan"))
        rs_out.fill_(float("nan"))
        graph.replay()
        expected_ag = torch.empty(n * world, dtype=dtype, device=device)
        dist.all_gather_into_tensor(expected_ag, x)
        expected_rs = torch.empty(n, dtype=dtype, device=device)
        dist.reduce_scatter_tensor(expected_rs, y)
        dist.all_reduce(z)
        where = f"replay {replay} rank {rank}"
        assert torch.equal(ag_out, expected_ag), f"all-gather differs: {where}"
        assert torch.equal(rs_out, expected_rs), f"reduce-scatter differs: {where}"
        assert torch.equal(ar, z), f"all-reduce differs: {where}"
    torch.cuda.synchronize()
    print(f"[rank {rank}] 5 graph replays matched NCCL ({collectives}: {routed_in_capture} on symmpool)",
          flush=True)
    del graph
    dist.destroy_process_group()


def async_work_orders_other_streams_after_the_collective(rank: int, world: int) -> None:
    """A symmpool all-reduce held back on its stream by a long sleep: a
    callback on its Future (as a DDP comm hook's) and Work.wait() on another
    stream both see the reduced values, never the inputs."""
    set_collectives_mode("always")
    import symmpool

    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    backend = dist.group.WORLD._get_backend(device)
    x = backend.allocate_tensor(1 << 20, dtype=torch.float32, device=device)
    side = torch.cuda.Stream(device)
    for trial in range(3):
        x.fill_(rank + 1 + trial)
        expected = world * (world + 1) / 2 + world * trial
        routed = symmpool.memory_stats(device)["symm_collectives"]
        torch.cuda._sleep(100_000_000)  # ~50 ms: the collective ends long after the host moves on
        work = dist.all_reduce(x, async_op=True)
        assert symmpool.memory_stats(device)["symm_collectives"] == routed + 1, "not run by symmpool"
        with torch.cuda.stream(side):
            if trial % 2 == 0:
                result = work.get_future().then(lambda fut: fut.value()[0] * 2).wait()
                expected *= 2
            else:
                work.wait()
                result = x.clone()
        torch.cuda.synchronize()
        wrong = (result != expected).sum().item()
        assert wrong == 0, f"trial {trial}: {wrong} of {result.numel()} values are not {expected} (first {result[0].item()})"
    dist.destroy_process_group()


def routing_decisions_are_counted_and_traced(rank: int, world: int) -> None:
    """Each call is counted under the reason that sent it where it ran, and
    SYMMPOOL_DEBUG_ROUTING=1 prints each decision to stderr."""
    set_collectives_mode("always")
    os.environ["SYMMPOOL_DEBUG_ROUTING"] = "1"
    import symmpool

    trace = tempfile.TemporaryFile()
    saved_stderr = os.dup(2)
    os.dup2(trace.fileno(), 2)  # the backend prints from C++
    try:
        device = init_group(rank, world, "cpu:gloo,cuda:symm")
        backend = dist.group.WORLD._get_backend(device)
        n = 1024
        symm_in = backend.allocate_tensor(n, dtype=torch.bfloat16, device=device).fill_(1)
        symm_out = backend.allocate_tensor(n * world, dtype=torch.bfloat16, device=device)
        # twice low-latency's limit in bf16: past it
        plain = torch.ones(symmpool._C.LOW_LATENCY_MAX_BYTES, dtype=torch.bfloat16, device=device)
        small_plain = torch.ones(n, dtype=torch.bfloat16, device=device)
        ints = backend.allocate_tensor(n, dtype=torch.int32, device=device).fill_(1)
        calls = [  # what the trace says, then the call
            (f"all_gather of {symm_out.nbytes} bytes -> symmpool: SYMMPOOL_COLLECTIVES=always",
             lambda: dist.all_gather_into_tensor(symm_out, symm_in)),
            (f"all_reduce of {plain.nbytes} bytes -> NCCL: buffer not in symmpool heap",
             lambda: dist.all_reduce(plain)),
            (f"all_reduce of {ints.nbytes} bytes -> NCCL: dtype not supported", lambda: dist.all_reduce(ints)),
        ]
        if world == 2:  # low-latency by the table: plain memory is enough
            calls.append((f"all_reduce of {small_plain.nbytes} bytes -> symmpool: SYMMPOOL_COLLECTIVES=always",
                          lambda: dist.all_reduce(small_plain)))
        calls += [
            (f"all_reduce of {symm_in.nbytes} bytes -> NCCL: reduce op not supported",
             lambda: dist.all_reduce(symm_in, op=dist.ReduceOp.MAX)),
        ]
        for decision, call in calls:
            reason = decision.split(": ", 1)[1]
            before = symmpool._C.routing_counts()
            call()
            after = symmpool._C.routing_counts()
            changed = {k: after[k] - before[k] for k in after if after[k] != before[k]}
            assert changed == {reason: 1}, f"rank {rank}: counted {changed}, expected {reason!r}"
        torch.cuda.synchronize()
    finally:
        sys.stderr.flush()
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
    trace.seek(0)
    lines = [line for line in trace.read().decode().splitlines() if " symmpool INFO ROUTING " in line]
    assert len(lines) == len(calls), lines
    for line, (decision, _) in zip(lines, calls):
        assert f"[rank {rank}] symmpool INFO ROUTING group " in line and decision in line, line
    dist.destroy_process_group()


def fsdp2_loss_parity(rank: int, world: int, steps: int, collectives: str, replicate: int = 1) -> None:
    set_collectives_mode(collectives)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    import fsdp2_train

    torch.cuda.set_device(rank)
    rc = fsdp2_train.main(["--steps", str(steps), "--layers", "2", "--dim", "256", "--replicate", str(replicate)])
    assert rc == 0, "FSDP2 on symm did not match stock NCCL (see the table above)"


def blocking_wait_times_out_and_waits(rank: int, world: int) -> None:
    """Under TORCH_NCCL_BLOCKING_WAIT, on a collective still queued behind a
    long kernel: wait(1 ms) raises DistBackendError naming the work (its
    message crashed the process with SIGSEGV where the build linked a private
    libstdc++: cmake/SharedLibstdcxx.cmake), and wait(a million days) waits for it
    (the timeout overflowed into the past and raised at once)."""
    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    import symmpool

    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    backend = dist.group.WORLD._get_backend(device)
    x = backend.allocate_tensor(1024, dtype=torch.float32, device=device)
    x.fill_(1.0)
    dist.all_reduce(x)  # forms the heap
    torch.cuda.synchronize()
    before = symmpool.memory_stats(device)["symm_collectives"]
    torch.cuda._sleep(200_000_000)  # about 0.1 s: the collective is still queued at wait()
    work = dist.all_reduce(x, async_op=True)
    assert symmpool.memory_stats(device)["symm_collectives"] == before + 1, "the call did not run on symmpool"
    expect_error(dist.DistBackendError, "did not finish within 1 ms",
                 lambda: work.wait(timeout=datetime.timedelta(milliseconds=1)),
                 "wait(1 ms) on a queued collective returned")
    work.wait(timeout=datetime.timedelta(days=10**6))
    assert torch.equal(x, torch.full_like(x, float(world * world))), x[:4]
    dist.destroy_process_group()


def a_heap_that_did_not_form_stays_failed(rank: int, world: int) -> None:
    """Rank 1 never makes a collective: rank 0's first one gives up forming
    the heap after the group's 5 s timeout, and its next call raises the same
    failure at once instead of forming the heap again (with peers that may be
    anywhere in theirs)."""
    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    import symmpool  # noqa: F401  (registers the backend)

    device = init_group(rank, world, "cpu:gloo,cuda:symm", timeout=datetime.timedelta(seconds=5))
    backend = dist.group.WORLD._get_backend(device)
    inp = backend.allocate_tensor(1024, dtype=torch.float32, device=device)
    out = backend.allocate_tensor(1024 * world, dtype=torch.float32, device=device)
    if rank == 0:
        start = time.monotonic()
        try:
            dist.all_gather_into_tensor(out, inp)
        except RuntimeError as e:
            first = str(e)
        else:
            raise AssertionError("the heap formed without rank 1")
        assert time.monotonic() - start >= 4.0, first
        # The first error already says why a peer may never come.
        assert "SYMMPOOL_COLLECTIVES=0 never does" in first, first
        start = time.monotonic()
        expect_error(RuntimeError, ("did not form", "rank 1 never arrived"),
                     lambda: dist.all_gather_into_tensor(out, inp),
                     "a collective after a heap that did not form raised nothing")
        assert time.monotonic() - start < 1.0, "the second call tried to form the heap again"
        print(f"[rank 0] first failure: {first.splitlines()[0][:200]}", flush=True)
    else:
        time.sleep(12)  # never joins; teardown is not collective
    dist.destroy_process_group()


def late_peer_times_out_with_the_group_timeout(rank: int, world: int) -> None:
    """Rank 0 enters a collective that the others join only after the group's
    5 s timeout: its barrier gives up after 5 s (not SYMMPOOL's default 600)
    and the next call raises an error naming the late rank."""
    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    os.environ.pop("SYMMPOOL_BARRIER_TIMEOUT", None)
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"  # raise, do not abort the process
    import symmpool  # noqa: F401  (registers the backend)

    device = init_group(rank, world, "cpu:gloo,cuda:symm", timeout=datetime.timedelta(seconds=5))
    backend = dist.group.WORLD._get_backend(device)
    inp = backend.allocate_tensor(1024, dtype=torch.float32, device=device)
    out = backend.allocate_tensor(1024 * world, dtype=torch.float32, device=device)
    dist.all_gather_into_tensor(out, inp)  # every rank: heap and communicator
    torch.cuda.synchronize()
    host_barrier()
    if rank == 0:
        start = time.monotonic()
        dist.all_gather_into_tensor(out, inp)
        torch.cuda.synchronize()  # returns once the barrier gave up
        waited = time.monotonic() - start
        print(f"[rank 0] all-gather without its peers returned after {waited:.1f} s", flush=True)
        # A fused kernel meets its peers twice; once its first meeting gave
        # up, the second must not wait another 5 s.
        assert 4.0 <= waited < 7.5, f"the barrier gave up after {waited:.1f} s, expected about 5 s"
        expect_error(RuntimeError, ("did not arrive within 5 s", "all_gather #"),
                     lambda: dist.all_gather_into_tensor(out, inp),
                     "a collective after a timed-out barrier raised nothing")
    else:
        time.sleep(12)  # late past the timeout; teardown is not collective
    dist.destroy_process_group()
