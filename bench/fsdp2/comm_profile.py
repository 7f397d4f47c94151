"""Exposed communication time from a torch.profiler trace: the time the GPU
spends on communication while no compute runs.

Communication: NCCL kernels (name contains "nccl"), symmpool's kernels
(`symmpool::detail::barrier_kernel`, `reduce_kernel`, `gather_copy_kernel`:
the name contains "symmpool"), peer-to-peer copies (Memcpy PtoP), and
device-to-device copies on streams that run no compute kernel (symmpool's
copy-engine all-gather issues plain DtoD copies from peer memory mapped into
this process, on the collective's stream or its side copy streams; FSDP2's own
copy-in/out are kernels). Everything else on the GPU is compute.

Exposed time is also split by why compute was off the GPU: the host had not
yet launched the next compute work, or it had and that work waited for a
collective (`exposed_by_cause`).
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import tempfile
from collections import Counter


def is_comm_kernel(name: str) -> bool:
    lower = name.lower()
    return "nccl" in lower or "symmpool" in lower


def gpu_events(events: list[dict]) -> list[tuple[dict, bool]]:
    """The kernels, memcpys and memsets of a Chrome trace, each with whether
    it is communication (the module's rule); other events are left out."""
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    compute_streams = {stream_of(e) for e in gpu if e["cat"] == "kernel" and not is_comm_kernel(e["name"])}

    def is_comm(e: dict) -> bool:
        if e["cat"] == "kernel":
            return is_comm_kernel(e["name"])
        if e["cat"] == "gpu_memcpy":
            return "PtoP" in e["name"] or ("DtoD" in e["name"] and stream_of(e) not in compute_streams)
        return False

    return [(e, is_comm(e)) for e in gpu]


def interval(event: dict) -> tuple[float, float]:
    start = float(event["ts"])
    return start, start + float(event.get("dur", 0.0))


def classify(events: list[dict]) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Chrome-trace GPU events -> (communication intervals, compute intervals),
    in microseconds. Events other than kernels, memcpys and memsets are ignored."""
    comm, compute = [], []
    for e, is_comm in gpu_events(events):
        (comm if is_comm else compute).append(interval(e))
    return comm, compute


def stream_of(event: dict):
    """The stream a trace's GPU event ran on (its thread id in older traces)."""
    args = event.get("args", {})
    return args.get("stream", event.get("tid"))


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def exposed_intervals(comm: list[tuple[float, float]],
                      compute: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The stretches of communication that no compute interval covers."""
    comm, compute = union(comm), union(compute)
    out, j = [], 0
    for start, end in comm:
        while j < len(compute) and compute[j][1] <= start:
            j += 1
        at, k = start, j
        while k < len(compute) and compute[k][0] < end:
            if compute[k][0] > at:
                out.append((at, compute[k][0]))
            at = max(at, compute[k][1])
            k += 1
        if at < end:
            out.append((at, end))
    return out


def exposed(comm: list[tuple[float, float]], compute: list[tuple[float, float]]) -> float:
    """Length of the communication time not covered by any compute interval."""
    return length(exposed_intervals(comm, compute))


def gpu_idle(comm: list[tuple[float, float]], compute: list[tuple[float, float]]) -> float:
    """Time inside the GPU's busy window (first start to last end) when
    nothing runs on it: the GPU waiting for the host, not for a transfer."""
    busy = union(comm + compute)
    return (busy[-1][1] - busy[0][0]) - length(busy) if busy else 0.0


def host_api_calls(events: list[dict], top: int = 6) -> dict:
    """The CUDA runtime and driver calls that took the host longest (total
    microseconds over the trace, largest first): a host that blocks (a
    synchronize, an event wait, a mapping) shows up here."""
    totals: dict[str, float] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver"):
            totals[e["name"]] = totals.get(e["name"], 0.0) + float(e.get("dur", 0.0))
    return dict(sorted(totals.items(), key=lambda kv: -kv[1])[:top])


def launch_starts(events: list[dict]) -> dict:
    """correlation id -> when the host began the CUDA call that enqueued that
    GPU work (us; the kernel cannot start before it)."""
    return {e["args"]["correlation"]: float(e["ts"]) for e in events
            if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
            and "correlation" in e.get("args", {})}


def exposed_by_cause(events: list[dict], stretches: list[tuple[float, float]]) -> dict:
    """Splits exposed communication by what kept compute off the GPU, from
    the compute work that ran next after each stretch: until the host began
    the call that enqueued it, the host was late (`host_late_us`: faster
    collectives would not shorten that part); after, the compute was queued
    and waited for a collective to finish (`comm_bound_us`). Host late is
    counted until the launch call began, a lower bound: the call's own
    microseconds count as waiting. Of compute items starting at one instant,
    the first in the trace decides. A stretch with no later compute, or
    whose next compute has no launch call in the trace, counts as
    `unattributed_us`."""
    launched = launch_starts(events)
    compute = sorted(((interval(e)[0], e.get("args", {}).get("correlation"))
                      for e, is_comm in gpu_events(events) if not is_comm), key=lambda item: item[0])
    starts = [start for start, _ in compute]
    out = {"host_late_us": 0.0, "comm_bound_us": 0.0, "unattributed_us": 0.0}
    for start, end in stretches:
        i = bisect.bisect_left(starts, end)
        launch = launched.get(compute[i][1]) if i < len(compute) else None
        if launch is None:
            out["unattributed_us"] += end - start
            continue
        late = min(max(launch - start, 0.0), end - start)
        out["host_late_us"] += late
        out["comm_bound_us"] += end - start - late
    return out


def collective_of(name: str) -> str | None:
    """Which kind of collective a communication kernel belongs to, from its
    name: "reduction" (reduce-scatter, all-reduce), "all_gather" (NCCL's
    kernel, symmpool's gather kernel), or None (copies, barriers and flags,
    which serve both)."""
    lower = name.lower()
    if "reducescatter" in lower or "allreduce" in lower or "reduce_kernel" in lower:
        return "reduction"
    if "allgather" in lower or "gather_copy" in lower:
        return "all_gather"
    return None


def exposed_by_collective(events: list[dict], stretches: list[tuple[float, float]]) -> dict:
    """Exposed time (us) by the kind of collective running then: only
    all-gathers, only reductions, both, or neither named ("other": a
    barrier alone). A named kernel counts as its own kind; a copy, barrier
    or flag wait as its stream's (the kind most of that stream's named
    kernels have), so a barrier on the reduce-scatter stream is a
    reduction. A stream of copies and barriers alone counts as all-gather
    (symmpool's copy-engine all-gather); so, misread, do the pulls of the
    two-step reduce-scatter (SYMMPOOL_REDUCE_SCATTER_ALGORITHM=two-step),
    which run on streams of their own."""
    comm = [(e, stream_of(e)) for e, is_comm in gpu_events(events) if is_comm]
    votes: dict = {}
    for e, stream in comm:
        kind = collective_of(e["name"])
        if kind:
            votes.setdefault(stream, Counter())[kind] += 1
    stream_kind = {stream: "all_gather" for e, stream in comm if e.get("cat") == "gpu_memcpy"}
    stream_kind.update({stream: counts.most_common(1)[0][0] for stream, counts in votes.items()})
    # sweep over item and stretch edges: at each edge, 0 = a stretch ends, 1 = an item ends,
    # 2 = an item starts, 3 = a stretch starts (ends before starts at one instant)
    edges = []
    for e, stream in comm:
        start, end = interval(e)
        kind = collective_of(e["name"]) or stream_kind.get(stream, "other")
        edges += [(start, 2, kind), (end, 1, kind)]
    edges += [edge for start, end in stretches for edge in ((start, 3, None), (end, 0, None))]
    edges.sort(key=lambda edge: (edge[0], edge[1]))
    active, inside, at = Counter(), 0, None
    out = {"all_gather": 0.0, "reduction": 0.0, "both": 0.0, "other": 0.0}
    for t, what, kind in edges:
        if inside and at is not None and t > at:
            running = {k for k in ("all_gather", "reduction") if active[k] > 0}
            out["both" if len(running) == 2 else running.pop() if running else "other"] += t - at
        at = t
        if what == 0:
            inside -= 1
        elif what == 3:
            inside += 1
        else:
            active[kind] += 1 if what == 2 else -1
    return out


def summarize(events: list[dict], steps: int) -> dict:
    """Per-step milliseconds of communication, compute and exposed
    communication, of GPU idle time, and the host's longest CUDA calls."""
    comm, compute = classify(events)
    if not compute:  # a trace without GPU kernels: say so rather than report zero
        raise RuntimeError("the profiler's trace holds no GPU kernel (is CUPTI working?)")
    per_step = 1e-3 / steps  # us over the window -> ms per step
    stretches = exposed_intervals(comm, compute)
    # Where the exposed time sits: a step's first all-gather (nothing to
    # overlap it yet) and its last reduce-scatter (the optimizer waits for
    # it) are exposed by construction; the rest is overlap that was missed.
    longest = sorted((e - s for s, e in stretches), reverse=True)[:2 * steps]
    return {
        "profiled_steps": steps,
        "comm_ms_per_step": length(union(comm)) * per_step,
        "compute_ms_per_step": length(union(compute)) * per_step,
        "exposed_comm_ms_per_step": length(stretches) * per_step,
        "exposed_stretches_per_step": len(stretches) / steps,
        "exposed_longest_ms": [round(d * 1e-3, 4) for d in longest],
        **{f"exposed_{cause[:-3]}_ms_per_step": us * per_step
           for cause, us in exposed_by_cause(events, stretches).items()},
        "exposed_by_collective_ms_per_step": {kind: round(us * per_step, 4) for kind, us
                                              in exposed_by_collective(events, stretches).items()},
        "comm_kernels": len(comm),
        "gpu_idle_ms_per_step": gpu_idle(comm, compute) * per_step,
        "host_api_ms_per_step": {name: round(us * per_step, 4) for name, us in host_api_calls(events).items()},
    }


def ops_by_host_time(averages, steps: int, top: int = 15) -> dict:
    """torch.profiler key averages -> the ops with the most host time of
    their own (ms per step, largest first), and with the most in all."""
    def ranked(attribute: str) -> dict:
        ops = sorted(averages, key=lambda a: -getattr(a, attribute))[:top]
        return {a.key: round(getattr(a, attribute) * 1e-3 / steps, 4) for a in ops}

    return {"self_ms_per_step": ranked("self_cpu_time_total"), "total_ms_per_step": ranked("cpu_time_total")}


def profile_steps(step, steps: int, host_ops: bool = False, keep_trace: str | None = None) -> dict:
    """Runs `step()` `steps` times under torch.profiler and summarizes the GPU
    timeline. CUDA activity only (the smallest trace; the CUDA API calls come
    with it) unless `host_ops`: then CPU ops too, and the ops that took the
    host longest (recording them slows the host a little). `keep_trace`: a
    path where the Chrome trace stays, gzipped (one per rank: to compare
    the ranks' timelines)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if host_ops else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json", prefix="fsdp2_trace_")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, "rb") as f:
            raw = f.read()
    finally:
        os.unlink(path)
    summary = summarize(json.loads(raw)["traceEvents"], steps)
    if keep_trace:
        try:
            with gzip.open(keep_trace, "wb") as f:
                f.write(raw)
        except OSError as e:  # the summary stands without the file
            summary["keep_trace_error"] = f"{keep_trace}: {e}"
    if host_ops:
        summary["host_ops"] = ops_by_host_time(prof.key_averages(), steps)
    return summary
