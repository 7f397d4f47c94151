"""symmpool's reduce-scatter and all-reduce algorithms through torch
(launch.run_workers, or run_sharing_one_gpu): SYMMPOOL_*_ALGORITHM prefer
one of them. Two-step: copy engines pull each rank's chunk, a local kernel
reduces it, copy engines push it (all-reduce), piece by piece; small pieces
put the larger calls through many pieces and every staging slot. One-shot
and two-shot: one kernel reads every peer (its per-rank arrays sized for 2,
4 or 8 ranks: ranks sharing a GPU reach the larger ones on a 2-GPU
machine). Every result equals gloo's reference bit for bit, and the
algorithm counts show that the chosen algorithms ran."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from dist_common import (all_reduce_back_to_back, all_reduce_matches_reference, init_group, reduction_reference,
                         small_integers)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
PIECE_BYTES = 64 * 1024  # the smallest SYMMPOOL_TWO_STEP_PIECE_BYTES takes


def _scatter_reference(t: torch.Tensor, rank: int, world: int, op) -> torch.Tensor:
    n = t.numel() // world
    return reduction_reference(t, op)[rank * n:(rank + 1) * n]


def algorithms_match_gloo(rank: int, world: int, all_reduce_algorithm: str = "two-step",
                          reduce_scatter_algorithm: str = "two-step") -> None:
    import symmpool

    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    os.environ["SYMMPOOL_ALL_REDUCE_ALGORITHM"] = all_reduce_algorithm
    os.environ["SYMMPOOL_REDUCE_SCATTER_ALGORITHM"] = reduce_scatter_algorithm
    os.environ["SYMMPOOL_TWO_STEP_PIECE_BYTES"] = str(PIECE_BYTES)
    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    pool = symmpool.mem_pool()
    gen = torch.Generator().manual_seed(200 + rank)
    ran = 0
    chosen = {all_reduce_algorithm, reduce_scatter_algorithm}

    def chosen_calls() -> int:
        counts = symmpool._C.algorithm_counts()
        return sum(counts[a] for a in chosen)

    before = chosen_calls()
    with torch.cuda.use_mem_pool(pool):
        for dtype in DTYPES:
            for n in (1, 3, 1001, 100_003, (1 << 20) + 5):  # up to 32 pieces of a rank's chunk
                for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                    t = small_integers(n, dtype, device, gen)
                    all_reduce_matches_reference(t, op, f"rank {rank}: all_reduce {dtype} n={n} {op}")
                    ran += 1

                    inp = small_integers(n * world, dtype, device, gen)
                    out = torch.full((n,), float("nan"), dtype=dtype, device=device)
                    dist.reduce_scatter_tensor(out, inp, op=op)
                    ran += 1
                    assert torch.equal(out.cpu(), _scatter_reference(inp, rank, world, op)), \
                        f"rank {rank}: reduce_scatter {dtype} n={n} {op} differs"
        assert chosen_calls() - before == ran, (chosen_calls() - before, ran)

        # The output on the input's first chunk: rank 0's own chunk (reduced
        # in place), every other rank's a chunk its peer pulls (staged first).
        n = 300_001
        inp = small_integers(n * world, torch.bfloat16, device, gen)
        expected = _scatter_reference(inp, rank, world, dist.ReduceOp.SUM)
        dist.reduce_scatter_tensor(inp[:n], inp)
        assert torch.equal(inp[:n].cpu(), expected), f"rank {rank}: reduce_scatter onto the input differs"

        # Back to back, no host sync, rank 0 late now and then: a staging slot
        # reused too early, or a push that lands late, shows.
        calls = [small_integers((70_001, 5, 400_003)[i % 3], torch.bfloat16, device, gen) for i in range(30)]
        all_reduce_back_to_back(rank, calls, late_every=10, what="all_reduce")

        # Captured in a CUDA graph, replayed with new inputs, one rank late.
        n = 200_003
        ar = torch.zeros(n, dtype=torch.bfloat16, device=device)
        rs_in = torch.zeros(n * world, dtype=torch.float32, device=device)
        rs_out = torch.zeros(n, dtype=torch.float32, device=device)

        def step():
            dist.all_reduce(ar)
            dist.reduce_scatter_tensor(rs_out, rs_in)

        step()  # eager once, as graph users warm up
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        for replay in range(4):
            ar.copy_(small_integers(n, torch.bfloat16, device, gen))
            rs_in.copy_(small_integers(n * world, torch.float32, device, gen))
            expected_ar = reduction_reference(ar, dist.ReduceOp.SUM)
            expected_rs = _scatter_reference(rs_in, rank, world, dist.ReduceOp.SUM)
            rs_out.fill_(float("nan"))
            torch.cuda.synchronize()
            if rank == world - 1:
                time.sleep(0.05)
            graph.replay()
            assert torch.equal(ar.cpu(), expected_ar), f"rank {rank}: replay {replay}: all_reduce differs"
            assert torch.equal(rs_out.cpu(), expected_rs), f"rank {rank}: replay {replay}: reduce_scatter differs"
    print(f"[rank {rank} of {world}] {ran} reduce-scatters ({reduce_scatter_algorithm}) and all-reduces "
          f"({all_reduce_algorithm}), then sequences and graph replays, matched gloo", flush=True)
    dist.destroy_process_group()
