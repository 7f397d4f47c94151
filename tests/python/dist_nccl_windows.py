"""NCCL's symmetric windows under a "symm" group: its heap's symmetric
segments become windows once NCCL's communicator exists, every collective
SYMMPOOL_COLLECTIVES=nccl-windows sends there matches plain NCCL, a call the
router did not check goes through plain copies, and the windows go with the
group. Any world size, one GPU per rank."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

import symmpool
from dist_common import init_group

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Odd sizes, per rank: one element, a prime, past a 4 KiB page, past 1 MiB.
COUNTS = (1, 1009, 4099, (1 << 19) + 7)


def _symm_group(windows: str):
    """A "symm" group that sends every call it can to NCCL's windows (both
    settings are read when its backend is made)."""
    os.environ["SYMMPOOL_COLLECTIVES"] = "nccl-windows"
    os.environ["SYMMPOOL_NCCL_WINDOWS"] = windows
    try:
        return dist.new_group(backend=symmpool.BACKEND_NAME)
    finally:
        os.environ.pop("SYMMPOOL_COLLECTIVES")
        os.environ.pop("SYMMPOOL_NCCL_WINDOWS")


def _random(n: int, dtype, device, gen) -> torch.Tensor:
    return torch.randn(n, generator=gen, device=device).to(dtype)


def _poisoned(backend, n: int, dtype, device) -> torch.Tensor:
    t = backend.allocate_tensor(n, dtype=dtype, device=device)
    t.fill_(float("nan"))
    return t


def _same(got: torch.Tensor, want: torch.Tensor, world: int, what: str) -> None:
    assert not torch.isnan(got).any(), f"{what}: output not written"
    if world <= 2:  # a sum of two is the same in any order: bit for bit
        assert torch.equal(got, want), f"{what}: differs from plain NCCL"
    else:
        torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")


def windows_match_nccl_and_go_with_the_group(rank: int, world: int) -> None:
    device = init_group(rank, world, f"cpu:gloo,cuda:{symmpool.BACKEND_NAME}")
    reference = dist.new_group(backend="nccl")  # plain NCCL on plain tensors
    group = _symm_group("1")
    backend = group._get_backend(device)
    gen = torch.Generator(device=device).manual_seed(1234 + rank)

    # The first call forms the heap and, NCCL's communicator made, the windows.
    warm = _poisoned(backend, 1024, torch.float32, device).fill_(1.0)
    dist.all_reduce(warm, group=group)
    stats = symmpool.memory_stats(device)
    assert stats["nccl_windows"] >= 1 and stats["nccl_window_bytes"] > 0, stats
    assert stats["nccl_window_refusals"] == 0, stats

    calls = 0
    before = symmpool.memory_stats(device)["nccl_window_collectives"]
    for dtype in DTYPES:
        for count in COUNTS:
            what = f"{dtype} x {count}"
            x = _random(count, dtype, device, gen)
            # all_gather, out of place and in place (FSDP2's way)
            inp = backend.allocate_tensor(count, dtype=dtype, device=device)
            inp.copy_(x)
            out = _poisoned(backend, count * world, dtype, device)
            dist.all_gather_into_tensor(out, inp, group=group)
            want = torch.empty(count * world, dtype=dtype, device=device)
            dist.all_gather_into_tensor(want, x.clone(), group=reference)
            _same(out, want, world, f"all_gather {what}")
            gathered = _poisoned(backend, count * world, dtype, device)
            gathered[rank * count:(rank + 1) * count].copy_(x)
            dist.all_gather_into_tensor(gathered, gathered[rank * count:(rank + 1) * count], group=group)
            _same(gathered, want, world, f"all_gather in place {what}")
            calls += 2
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                y = _random(count * world, dtype, device, gen)
                rs_in = backend.allocate_tensor(count * world, dtype=dtype, device=device)
                rs_in.copy_(y)
                rs_out = _poisoned(backend, count, dtype, device)
                dist.reduce_scatter_tensor(rs_out, rs_in, op=op, group=group)
                rs_want = torch.empty(count, dtype=dtype, device=device)
                dist.reduce_scatter_tensor(rs_want, y.clone(), op=op, group=reference)
                _same(rs_out, rs_want, world, f"reduce_scatter {op} {what}")
                ar = backend.allocate_tensor(count, dtype=dtype, device=device)
                ar.copy_(x)
                ar_want = x.clone()
                dist.all_reduce(ar, op=op, group=group)
                dist.all_reduce(ar_want, op=op, group=reference)
                _same(ar, ar_want, world, f"all_reduce {op} {what}")
                calls += 2
    torch.cuda.synchronize(device)
    stats = symmpool.memory_stats(device)
    assert stats["nccl_window_collectives"] - before == calls, (stats["nccl_window_collectives"], before, calls)

    # In a CUDA graph: the meeting and NCCL's kernel replay together.
    buf = backend.allocate_tensor(4099, dtype=torch.bfloat16, device=device)
    buf.copy_(_random(4099, torch.bfloat16, device, gen))
    dist.all_reduce(buf, group=group)  # seen eagerly first
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        dist.all_reduce(buf, group=group)
    torch.cuda.current_stream(device).wait_stream(side)
    for _ in range(3):
        x = _random(4099, torch.bfloat16, device, gen)
        buf.copy_(x)
        want = x.clone()
        graph.replay()
        dist.all_reduce(want, group=reference)
        _same(buf, want, world, "all_reduce replayed")

    # A call the router does not check (MAX: symmpool takes sum and avg
    # only) must not hand NCCL window memory: it goes through plain copies.
    staged_before = symmpool.memory_stats(device)["staged_nccl_calls"]
    m = backend.allocate_tensor(1009, dtype=torch.float32, device=device)
    x = _random(1009, torch.float32, device, gen)
    dist.all_reduce(m, group=group)  # checked: its segment is synced, a window now
    m.copy_(x)
    want = x.clone()
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(want, op=dist.ReduceOp.MAX, group=reference)
    _same(m, want, world, "all_reduce max, staged")
    assert symmpool.memory_stats(device)["staged_nccl_calls"] == staged_before + 1

    # SYMMPOOL_NCCL_WINDOWS=0: a group makes none, and says so per call.
    without = _symm_group("0")
    windows_before = symmpool.memory_stats(device)["nccl_windows"]
    reason = "no NCCL windows on this group"
    none_before = symmpool._C.routing_counts()[reason]
    t = without._get_backend(device).allocate_tensor(1024, dtype=torch.float32, device=device).fill_(1.0)
    dist.all_reduce(t, group=without)
    dist.all_reduce(t, group=without)
    assert torch.equal(t, torch.full_like(t, world * world))
    assert symmpool.memory_stats(device)["nccl_windows"] == windows_before
    assert symmpool._C.routing_counts()[reason] == none_before + 2

    # The windows go with their group, before its heap.
    del warm, buf, m, t, backend
    dist.destroy_process_group(group)
    dist.destroy_process_group(without)
    torch.cuda.synchronize(device)
    assert symmpool.memory_stats(device)["nccl_windows_in_process"] == 0
    dist.destroy_process_group()
