"""The low-latency all-reduce through torch (launch.run_workers, or
run_sharing_one_gpu on a 1-GPU machine): SYMMPOOL_ALL_REDUCE_ALGORITHM
prefers it, every result equals gloo's reference bit for bit, and the
algorithm counts show that it, not another, ran."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from dist_common import init_group

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _every_ranks(t: torch.Tensor) -> list:
    """[rank 0's t, rank 1's t, ...] on the CPU, exact: bytes over gloo."""
    flat = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, flat)
    return [p.view(t.dtype) for p in parts]


def _reference(t: torch.Tensor, op) -> torch.Tensor:
    """What symmpool's reductions compute: an fp32 sum in rank order, times
    1/world for an average, rounded once."""
    parts = _every_ranks(t)
    acc = torch.zeros(t.numel(), dtype=torch.float32)
    for p in parts:
        acc += p.float()
    if op == dist.ReduceOp.AVG:
        acc *= 1.0 / len(parts)
    return acc.to(t.dtype).reshape(t.shape)


def _integers(n: int, dtype, device, gen) -> torch.Tensor:
    """Small integers: exact in every dtype and any order of summation."""
    return torch.randint(-8, 9, (n,), generator=gen).to(dtype).to(device)


def low_latency_all_reduce_matches_gloo(rank: int, world: int) -> None:
    import symmpool

    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    os.environ["SYMMPOOL_ALL_REDUCE_ALGORITHM"] = "low-latency"
    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    pool = symmpool.mem_pool()
    gen = torch.Generator().manual_seed(100 + rank)
    most = 32 * 1024  # Communicator::kLowLatencyMaxBytes
    ran = 0

    def low_latency_calls() -> int:
        return symmpool._C.algorithm_counts()["low-latency"]

    before = low_latency_calls()
    with torch.cuda.use_mem_pool(pool):
        for dtype in DTYPES:
            size = torch.tensor([], dtype=dtype).element_size()
            for n in (1, 3, 1001, most // size - 1, most // size):
                for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                    t = _integers(n, dtype, device, gen)
                    expected = _reference(t, op)
                    dist.all_reduce(t, op=op)
                    ran += 1
                    assert torch.equal(t.cpu(), expected), f"rank {rank}: {dtype} n={n} {op} differs"
            # The functional op, out of place, runs the same kernel.
            t = _integers(1001, dtype, device, gen)
            out = torch.ops.symmpool.all_reduce(t, "sum", dist.group.WORLD.group_name)
            ran += 1
            assert torch.equal(out.cpu(), _reference(t, dist.ReduceOp.SUM)), f"rank {rank}: functional {dtype}"
        assert low_latency_calls() - before == ran, (low_latency_calls() - before, ran)

        # Too large for it: the table's algorithm runs instead, and says so.
        t = _integers(most // 4 + 1, torch.float32, device, gen)
        expected = _reference(t, dist.ReduceOp.SUM)
        two_shot = symmpool._C.algorithm_counts()["two-shot"]
        dist.all_reduce(t)
        assert torch.equal(t.cpu(), expected), f"rank {rank}: the larger all-reduce differs"
        assert symmpool._C.algorithm_counts()["two-shot"] == two_shot + 1
        assert low_latency_calls() - before == ran

        # Back to back, three sizes (a period other than the two packet
        # regions'), no host sync, rank 0 late now and then: a packet taken
        # from the wrong call shows.
        calls = [_integers((5, 1001, 4093)[i % 3], torch.bfloat16, device, gen) for i in range(60)]
        expected = [_reference(t, dist.ReduceOp.SUM) for t in calls]
        for i, t in enumerate(calls):
            if rank == 0 and i % 20 == 10:
                torch.cuda._sleep(5_000_000)
            dist.all_reduce(t)
        for i, (t, e) in enumerate(zip(calls, expected)):
            assert torch.equal(t.cpu(), e), f"rank {rank}: back-to-back call {i} differs"

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
            fresh = [_integers(t.numel(), torch.bfloat16, device, gen) for t in graphed]
            expected = [_reference(f, dist.ReduceOp.SUM) for f in fresh]
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
