"""Timers and statistics of the peer benchmark: eager (CUDA events around
back-to-back calls) and CUDA-graph (events around one replay of captured
calls) timing, percentiles, the slowest rank per repetition, and bandwidth as
nccl-tests defines it."""

from __future__ import annotations

import time
from typing import Callable

import numpy

GRAPH_WARMUP_CALLS = 3  # eager calls on a side stream before a capture

# busbw = algbw * factor: the bytes each rank sends (and receives) over its
# links per byte of the op's size, as nccl-tests counts them.
BUS_FACTOR = {
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "peer_copy": lambda n: (n - 1) / n,  # the bytes a rank receives in an all-gather of this size
}


def bandwidth(op: str, nbytes: int, time_us: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes per second) of `nbytes` (all-gather
    output, reduce-scatter input, all-reduce buffer) in `time_us`."""
    if time_us is None or time_us <= 0:
        return None, None
    algbw = nbytes / time_us / 1e3
    return algbw, algbw * BUS_FACTOR[op](world)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), interpolated linearly (numpy's default)."""
    if not values:
        raise ValueError("no values")
    return float(numpy.percentile(values, q))


def slowest_rank(per_rank: list[list[float]]) -> list[float]:
    """Per repetition, the largest time over ranks: a collective takes as
    long as its slowest rank."""
    if len({len(s) for s in per_rank}) != 1:
        raise ValueError(f"ranks timed different numbers of repetitions: {[len(s) for s in per_rank]}")
    return [max(times) for times in zip(*per_rank)]


def summarize(per_rank: list[list[float]]) -> dict:
    """Per-call microseconds of every rank's repetitions -> median, p10, p90
    over repetitions of the slowest rank's time."""
    times = slowest_rank(per_rank)
    return {"time_us_median": percentile(times, 50), "time_us_p10": percentile(times, 10),
            "time_us_p90": percentile(times, 90)}


def host_median(per_rank: list | None) -> float | None:
    """Median over repetitions of the slowest rank's host time per call
    (time_eager's `host`), or None where the ranks' repetitions do not pair
    up (a diagnostic never stops a run)."""
    if not per_rank or not all(per_rank) or len({len(r) for r in per_rank}) != 1:
        return None
    return summarize(per_rank)["time_us_median"]


def time_eager(run: Callable[[], object], iters: int, reps: int, warmup: int,
               start_together: Callable[[], None], host: list | None = None) -> list[float]:
    """Per-call microseconds of each repetition: `iters` calls back to back
    between two CUDA events, the ranks started together before each. Into
    `host`, if given, the host's per-call microseconds of each repetition
    (from the first call to the return of the last): where it is close to
    the events' time, the calls are bound by the host, not the GPU."""
    import torch

    for _ in range(warmup):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        start_together()
        start.record()
        began = time.perf_counter()
        for _ in range(iters):
            run()
        if host is not None:
            host.append((time.perf_counter() - began) * 1e6 / iters)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / iters)
    return samples


def time_graph(run: Callable[[], object], calls: int, reps: int,
               start_together: Callable[[], None], replays: int = 1,
               meet: Callable[[], object] | None = None) -> list[float]:
    """Per-call microseconds of each repetition: `replays` back-to-back
    replays of a CUDA graph of `calls` captured calls between two CUDA
    events, the first launch's latency spread over all of them. `meet`, if
    given, enqueues a meeting of the ranks' devices before the start event,
    so that the replays start together on every device. Warmed up on a side
    stream first, as torch.cuda.graph's documentation asks (lazy setup of
    communicators and workspaces must not land in the capture)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(GRAPH_WARMUP_CALLS):
            run()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            run()
    start_together()
    graph.replay()  # the first replay uploads the graph: not timed
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        start_together()
        if meet is not None:
            meet()
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / (calls * replays))
    del graph
    return samples
