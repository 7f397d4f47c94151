"""Why a step's host part is slow: the main thread's CPU time in it (a
thread that waits or is descheduled uses less than the wall time), its
context switches (voluntary: it blocked; involuntary: it was preempted), the
process's CPU time in it (every thread's: the backward's too), the time Python's
collector took and, optionally, every thread's share. The main thread only
runs the forward and the optimizer: the backward runs on autograd's device
threads while the main thread waits, so a slow backward shows in their
times, not in its own.

Linux's /proc/<pid>/task/<tid>/schedstat gives each thread's time on a CPU
and its time runnable but waiting for one (the host's other load), in ns;
its stat gives the thread's minor page faults (a large temporary buffer that
malloc maps afresh faults in every page each time: pure CPU time that shows
in no profiler op but the one that touched it). Elsewhere `sample()` returns
{} and the times stay empty.
"""

from __future__ import annotations

import collections
import gc
import os
import resource
import statistics
import time


def sample() -> dict[int, tuple[str, int, int, int]]:
    """tid -> (thread name, ns on a CPU, ns waiting for a CPU, minor faults)."""
    base = f"/proc/{os.getpid()}/task"
    out = {}
    try:
        tids = os.listdir(base)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{base}/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"{base}/{tid}/schedstat") as f:
                run_ns, wait_ns = (int(x) for x in f.read().split()[:2])
            with open(f"{base}/{tid}/stat") as f:  # after the name's ")": state is field 3, minflt field 10
                minor_faults = int(f.read().rsplit(")", 1)[1].split()[7])
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile, or no schedstat
            continue
        out[int(tid)] = (name, run_ns, wait_ns, minor_faults)
    return out


def delta_by_name(before: dict, after: dict) -> dict[str, tuple[float, float, int]]:
    """Milliseconds on a CPU and waiting for one, and minor faults, between
    two samples, summed over the threads of each name (threads born in
    between count from 0)."""
    out: dict[str, list] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for tid, (name, run_ns, wait_ns, faults) in after.items():
        _, run0, wait0, faults0 = before.get(tid, (name, 0, 0, 0))
        out[name][0] += (run_ns - run0) * 1e-6
        out[name][1] += (wait_ns - wait0) * 1e-6
        out[name][2] += faults - faults0
    return {name: tuple(v) for name, v in out.items()}


class GcTimer:
    """Time Python's collector spends, and full (generation 2) collections."""

    def __init__(self):
        self.ms, self.full, self._start = 0.0, 0, None
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.ms += (time.perf_counter() - self._start) * 1e3
            self.full += info.get("generation") == 2
            self._start = None

    def read(self) -> tuple[float, int]:
        return self.ms, self.full

    def close(self) -> None:
        gc.callbacks.remove(self._callback)


def summarize(per_step: list[dict[str, tuple[float, float, int]]], min_ms: float = 0.5) -> dict:
    """Per-step medians by thread name, of the threads that ran at least
    `min_ms` in a median step, busiest first:
    {name: {"run_ms", "wait_ms", "minor_faults"}}."""
    names = {name for step in per_step for name in step}
    medians = {}
    for name in names:
        steps = [step.get(name, (0.0, 0.0, 0)) for step in per_step]
        medians[name] = {"run_ms": round(statistics.median(s[0] for s in steps), 3),
                         "wait_ms": round(statistics.median(s[1] for s in steps), 3),
                         "minor_faults": statistics.median(s[2] for s in steps)}
    busy = sorted((kv for kv in medians.items() if kv[1]["run_ms"] >= min_ms), key=lambda kv: -kv[1]["run_ms"])
    return dict(busy)


def thread_usage():
    """This thread's resource usage (Linux's RUSAGE_THREAD; the process's elsewhere)."""
    return resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF))


# The per-step lists StepHostMeter.results() gives (aggregate.py summarizes them).
FIELDS = ("host_cpu_ms", "process_cpu_ms", "host_voluntary_switches", "host_involuntary_switches", "gc_ms",
          "gc_full_collections")


class StepHostMeter:
    """Call start() before a step, host_done() when its calls have returned,
    step_done() after the device sync; results() gives per measured step
    lists (and, with `threads`, per-thread medians: reading /proc costs the
    host about a millisecond a step, after the host part; it lengthens the
    step only where the GPU is not behind the host)."""

    def __init__(self, threads: bool = False):
        self._threads, self._gc = threads, GcTimer()
        self._fields = {key: [] for key in FIELDS}
        self._thread_steps: list[dict] = []

    def start(self, measured: bool) -> None:
        self._measured = measured
        self._thread_sample = sample() if self._threads and measured else None
        self._gc_start, self._usage = self._gc.read(), thread_usage()
        self._cpu, self._process_cpu = time.thread_time(), time.process_time()

    def host_done(self) -> None:
        self._host_cpu, self._process_done = time.thread_time(), time.process_time()
        self._usage_done, self._gc_done = thread_usage(), self._gc.read()
        if self._thread_sample is not None:
            self._thread_steps.append(delta_by_name(self._thread_sample, sample()))

    def step_done(self) -> None:
        if not self._measured:
            return
        f = self._fields
        f["host_cpu_ms"].append((self._host_cpu - self._cpu) * 1e3)
        # every thread's CPU in the host part: beyond host_cpu_ms, what the
        # other threads (autograd's backward, NCCL's, symmpool's) used
        f["process_cpu_ms"].append((self._process_done - self._process_cpu) * 1e3)
        f["host_voluntary_switches"].append(self._usage_done.ru_nvcsw - self._usage.ru_nvcsw)
        f["host_involuntary_switches"].append(self._usage_done.ru_nivcsw - self._usage.ru_nivcsw)
        f["gc_ms"].append(self._gc_done[0] - self._gc_start[0])
        f["gc_full_collections"].append(self._gc_done[1] - self._gc_start[1])

    def results(self) -> dict:
        """The per-step lists, and "host_threads_ms" (None without `threads`);
        stops timing the collector."""
        self._gc.close()
        return dict(self._fields, host_threads_ms=summarize(self._thread_steps) if self._thread_steps else None)
