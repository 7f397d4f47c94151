"""Helpers the multi-GPU test bodies share."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def ranks_share_gpu() -> bool:
    """launch.run_sharing_one_gpu started this rank: every rank is on GPU 0."""
    # Read as symmpool reads it (allocator/src/environment.cpp).
    return os.environ.get("SYMMPOOL_TEST_RANKS_SHARE_GPU", "").lower() in ("1", "true", "yes", "on")


def init_group(rank: int, world: int, backend: str, **kwargs):
    if ranks_share_gpu():
        # No device_id: it would connect NCCL at once, and NCCL refuses two
        # ranks on one GPU.
        torch.cuda.set_device(0)
        dist.init_process_group(backend, rank=rank, world_size=world, **kwargs)
        return torch.device("cuda", 0)
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(backend, rank=rank, world_size=world, device_id=device, **kwargs)
    return device


def host_barrier() -> None:
    """dist.barrier(); where the ranks share a GPU (NCCL refuses them), the
    same over gloo, the default group's CPU backend."""
    if ranks_share_gpu():
        dist.all_reduce(torch.zeros(1))
    else:
        dist.barrier()


def poisoned(backend, n: int, dtype, device):
    t = backend.allocate_tensor(n, dtype=dtype, device=device)
    t.fill_(float("nan"))
    return t


# SYMMPOOL_COLLECTIVES for a test's `collectives` mode: "table" is the default (unset).
def expect_error(kind, texts, call, what: str) -> None:
    """`call()` raises `kind` whose message holds `texts` (a string or several);
    else AssertionError(`what`)."""
    try:
        call()
    except kind as e:
        for text in [texts] if isinstance(texts, str) else texts:
            assert text in str(e), str(e)
    else:
        raise AssertionError(what)


def set_collectives_mode(collectives: str) -> None:
    if collectives == "table":
        os.environ.pop("SYMMPOOL_COLLECTIVES", None)
    else:
        os.environ["SYMMPOOL_COLLECTIVES"] = collectives


def every_ranks(t: torch.Tensor) -> list:
    """[rank 0's t, rank 1's t, ...] on the CPU, exact: bytes over the default
    group's CPU backend (gloo), so it works where the ranks share a GPU."""
    flat = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, flat)
    return [p.view(t.dtype).reshape(t.shape) for p in parts]


def reduction_reference(t: torch.Tensor, op) -> torch.Tensor:
    """Every rank's t reduced as symmpool's kernels do: an fp32 sum in rank
    order, times 1/world for an average, rounded once; on the CPU."""
    parts = every_ranks(t)
    acc = torch.zeros(t.shape, dtype=torch.float32)
    for p in parts:
        acc += p.float()
    if op == dist.ReduceOp.AVG:
        acc *= 1.0 / len(parts)
    return acc.to(t.dtype)


def small_integers(n: int, dtype, device, gen) -> torch.Tensor:
    """Small integers: exact in every dtype and any order of summation."""
    return torch.randint(-8, 9, (n,), generator=gen).to(dtype).to(device)


def all_reduce_matches_reference(t: torch.Tensor, op, what: str) -> None:
    """dist.all_reduce of t in place, then equal to reduction_reference bit
    for bit (taken before the call)."""
    expected = reduction_reference(t, op)
    dist.all_reduce(t, op=op)
    assert torch.equal(t.cpu(), expected), f"{what} differs"


def all_reduce_back_to_back(rank: int, calls: list, late_every: int, what: str) -> None:
    """dist.all_reduce on each of `calls` in turn, no host sync between them,
    rank 0 late (a 5 M-cycle GPU sleep) at every `late_every`-th call from
    the middle of the first period; then each result against the reference
    taken before: a buffer or slot reused too early, or data that lands
    late, shows."""
    expected = [reduction_reference(t, dist.ReduceOp.SUM) for t in calls]
    for i, t in enumerate(calls):
        if rank == 0 and i % late_every == late_every // 2:
            torch.cuda._sleep(5_000_000)
        dist.all_reduce(t)
    for i, (t, e) in enumerate(zip(calls, expected)):
        assert torch.equal(t.cpu(), e), f"rank {rank}: back-to-back {what} {i} differs"
