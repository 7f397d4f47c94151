"""The low-latency all-reduce through torch (launch.run_workers, or
run_sharing_one_gpu on a 1-GPU machine): SYMMPOOL_ALL_REDUCE_ALGORITHM
prefers it, every result equals gloo's reference bit for bit, and the
algorithm counts show that it, not another, ran."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from dist_common import (all_reduce_back_to_back, all_reduce_matches_reference, init_group, reduction_reference,
                         small_integers)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def low_latency_all_reduce_matches_gloo(rank: int, world: int) -> None:
    import symmpool

    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    os.environ["SYMMPOOL_ALL_REDUCE_ALGORITHM"] = "low-latency"
    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    pool = symmpool.mem_pool()
    most = symmpool._C.LOW_LATENCY_MAX_BYTES
    gen = torch.Generator().manual_seed(100 + rank)
    ran = 0

    def low_latency_calls() -> int:
        return symmpool._C.algorithm_counts()["low-latency"]

    before = low_latency_calls()
    with torch.cuda.use_mem_pool(pool):
        for dtype in DTYPES:
            size = torch.tensor([], dtype=dtype).element_size()
            for n in (1, 3, 1001, most // size - 1, most // size):
                for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                    t = small_integers(n, dtype, device, gen)
                    all_reduce_matches_reference(t, op, f"rank {rank}: {dtype} n={n} {op}")
                    ran += 1
            # The functional op, out of place, runs the same kernel.
            t = small_integers(1001, dtype, device, gen)
            out = torch.ops.symmpool.all_reduce(t, "sum", dist.group.WORLD.group_name)
            ran += 1
            assert torch.equal(out.cpu(), reduction_reference(t, dist.ReduceOp.SUM)), f"rank {rank}: functional {dtype}"
        assert low_latency_calls() - before == ran, (low_latency_calls() - before, ran)

        # Too large for it: the table's algorithm runs instead, and says so.
        t = small_integers(most // 4 + 1, torch.float32, device, gen)
        expected = reduction_reference(t, dist.ReduceOp.SUM)
        two_shot = symmpool._C.algorithm_counts()["two-shot"]
        dist.all_reduce(t)
        assert torch.equal(t.cpu(), expected), f"rank {rank}: the larger all-reduce differs"
        assert symmpool._C.algorithm_counts()["two-shot"] == two_shot + 1
        assert low_latency_calls() - before == ran

        # The functional op at that size: out of place into a new tensor of
        # the pool (two-shot straight into it), the input left as it was.
        t = small_integers(100_003, torch.bfloat16, device, gen)
        kept = t.clone()
        out = torch.ops.symmpool.all_reduce(t, "avg", dist.group.WORLD.group_name)
        assert torch.equal(out.cpu(), reduction_reference(kept, dist.ReduceOp.AVG)), f"rank {rank}: functional two-shot"
        assert torch.equal(t, kept), f"rank {rank}: the functional op changed its input"
        assert symmpool._C.algorithm_counts()["two-shot"] == two_shot + 2

        # ... and straight to the backend: c10d's dispatcher (which
        # dist.all_reduce goes through, checked first so that a renamed event
        # cannot make the check pass) does not see it.
        def through_c10d(call) -> bool:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                call()
            return any(e.name == "c10d::allreduce_" for e in prof.events())

        small = small_integers(1001, torch.bfloat16, device, gen)
        assert through_c10d(lambda: dist.all_reduce(small)), f"rank {rank}: no c10d::allreduce_ event to look for"
        assert not through_c10d(lambda: torch.ops.symmpool.all_reduce(small, "sum", dist.group.WORLD.group_name)), \
            f"rank {rank}: the functional op went through c10d's dispatcher"

        # In place (torch.ops.symmpool.all_reduce_), below and above the
        # low-latency limit: the input's own storage written, not through
        # c10d; a tensor that is not contiguous goes through a contiguous
        # copy and comes back into the view.
        name = dist.group.WORLD.group_name
        for n, algorithm in ((1001, "low-latency"), (100_003, "two-shot")):
            t = small_integers(n, torch.bfloat16, device, gen)
            expected = reduction_reference(t, dist.ReduceOp.SUM)
            ptr, version, counted = t.data_ptr(), t._version, symmpool._C.algorithm_counts()[algorithm]
            torch.ops.symmpool.all_reduce_(t, "sum", name)
            assert torch.equal(t.cpu(), expected), f"rank {rank}: in place, {n}"
            assert t.data_ptr() == ptr and t._version > version, f"rank {rank}: in place, {n}: not in place"
            assert symmpool._C.algorithm_counts()[algorithm] == counted + 1, f"rank {rank}: in place, {n}"
        strided = small_integers(2 * 1001, torch.float32, device, gen).view(1001, 2).t()
        expected = reduction_reference(strided.contiguous(), dist.ReduceOp.AVG)
        torch.ops.symmpool.all_reduce_(strided, "avg", name)
        assert torch.equal(strided.cpu(), expected) and not strided.is_contiguous(), f"rank {rank}: strided"
        assert not through_c10d(lambda: torch.ops.symmpool.all_reduce_(small, "sum", name)), \
            f"rank {rank}: the in-place op went through c10d's dispatcher"

        # Back to back, three sizes (a period other than the two packet
        # regions'), no host sync, rank 0 late now and then: a packet taken
        # from the wrong call shows.
        calls = [small_integers((5, 1001, 4093)[i % 3], torch.bfloat16, device, gen) for i in range(60)]
        all_reduce_back_to_back(rank, calls, late_every=20, what="call")

        # Captured in a CUDA graph, replayed with new inputs, one rank late.
        graphed = [torch.zeros(n, dtype=torch.bfloat16, device=device) for n in (7, 4093, 16384)]
        for t in graphed:
            dist.all_reduce(t)  # eager once, as graph users warm up
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for t in graphed:
                dist.all_reduce(t)
        for replay in range(4):
            fresh = [small_integers(t.numel(), torch.bfloat16, device, gen) for t in graphed]
            expected = [reduction_reference(f, dist.ReduceOp.SUM) for f in fresh]
            for t, f in zip(graphed, fresh):
                t.copy_(f)
            torch.cuda.synchronize()
            if rank == world - 1:
                time.sleep(0.05)
            graph.replay()
            for t, e in zip(graphed, expected):
                assert torch.equal(t.cpu(), e), f"rank {rank}: replay {replay} of {t.numel()} differs"
    print(f"[rank {rank}] {ran} low-latency all-reduces and their replays matched gloo", flush=True)
    dist.destroy_process_group()


def plain_tensors_take_low_latency_by_the_table(rank: int, world: int) -> None:
    """With the table (no preference), 2 ranks: an all-reduce of plain
    tensors up to 128 KiB runs low-latency, which reads no peer's buffer,
    instead of going to NCCL, eagerly and in a CUDA graph, bit for bit as
    gloo's reference, and no call is counted as run elsewhere. Larger plain
    all-reduces still go to NCCL (where NCCL can run: not with ranks sharing
    a GPU)."""
    import symmpool

    from dist_common import ranks_share_gpu

    os.environ.pop("SYMMPOOL_COLLECTIVES", None)
    os.environ.pop("SYMMPOOL_ALL_REDUCE_ALGORITHM", None)
    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    gen = torch.Generator().manual_seed(300 + rank)
    most = symmpool._C.LOW_LATENCY_MAX_BYTES  # what the table gives low-latency at 2 ranks
    not_in_heap = "buffer not in symmpool heap"

    def counts() -> tuple[int, int]:
        return symmpool._C.algorithm_counts()["low-latency"], symmpool._C.routing_counts()[not_in_heap]

    low_latency0, elsewhere0 = counts()
    calls = 0
    for dtype in DTYPES:
        for n in (1, 1001, most // torch.tensor([], dtype=dtype).element_size()):
            t = small_integers(n, dtype, device, gen)  # torch's own allocator: not in the heap
            expected = reduction_reference(t, dist.ReduceOp.SUM)
            dist.all_reduce(t)
            calls += 1
            assert torch.equal(t.cpu(), expected), f"rank {rank}: plain {dtype} n={n} differs"
    graphed = torch.zeros(4093, dtype=torch.bfloat16, device=device)
    dist.all_reduce(graphed)  # eager once, as graph users warm up
    calls += 1
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(graphed)
    for replay in range(3):
        fresh = small_integers(graphed.numel(), torch.bfloat16, device, gen)
        expected = reduction_reference(fresh, dist.ReduceOp.SUM)
        graphed.copy_(fresh)
        torch.cuda.synchronize()
        graph.replay()
        assert torch.equal(graphed.cpu(), expected), f"rank {rank}: plain replay {replay} differs"
    low_latency1, elsewhere1 = counts()
    assert (low_latency1 - low_latency0, elsewhere1 - elsewhere0) == (calls + 1, 0), (
        low_latency1 - low_latency0, elsewhere1 - elsewhere0, calls)  # + 1: the captured call
    if not ranks_share_gpu():
        t = small_integers(most // 4 + 1, torch.float32, device, gen)
        expected = reduction_reference(t, dist.ReduceOp.SUM)
        dist.all_reduce(t)
        assert torch.equal(t.cpu(), expected), f"rank {rank}: the larger plain all-reduce differs"
        assert counts() == (low_latency1, elsewhere1 + 1), counts()
    print(f"[rank {rank}] {calls} plain all-reduces ran low-latency", flush=True)
    dist.destroy_process_group()
