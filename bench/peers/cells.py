"""One (peer, variant, op, size) on every rank: set up the call, check it
against NCCL's result, time it eager and in a CUDA graph. Every step ends
with the ranks agreeing (over a CPU gloo group) on whether it failed
anywhere, so a failure on one rank skips the cell on all of them instead of
leaving the others waiting in a collective."""

from __future__ import annotations

import datetime
import os
import time
import zlib

import torch
import torch.distributed as dist

import timing
from peers import PEER_COPY, DTYPE, input_numel


def start_ranks():
    """Under torchrun: this rank's GPU, the default group ("cpu:gloo,cuda:nccl")
    and a CPU group for agreeing; returns (device, world, rank, Ranks)."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device)
    ranks = Ranks(dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=300)),
                  device_group=dist.group.WORLD)
    return device, dist.get_world_size(), dist.get_rank(), ranks


class RanksOutOfStep(SystemExit):
    """The ranks reached different steps: one failed where its peers did
    not (inside a step, before its shared verdict). Not an Exception, so
    attempt() does not swallow it: every rank stops at once with the
    reason, instead of the ranks waiting in different collectives until
    the group's timeout (the JSON keeps the cells already written)."""


class Ranks:
    """What the ranks do together on the CPU: start a timing, exchange
    values. Every exchange carries its kind, so ranks that fell out of step
    (one rank's error verdict meeting another's barrier) stop with
    RanksOutOfStep."""

    def __init__(self, group, device_group=None):
        self.group, self.device_group = group, device_group
        self.world = dist.get_world_size(group)
        self._meeting = None  # the device meeting's one-element tensor, made on first use

    def _exchange(self, kind: str, value) -> list:
        got = [None] * self.world
        dist.all_gather_object(got, (kind, value), group=self.group)
        if len({k for k, _ in got}) > 1:
            steps = "; ".join(f"rank {r}: {k}" + (f" ({v})" if k == "error" and v else "")
                              for r, (k, v) in enumerate(got))
            raise RanksOutOfStep(f"bench ranks out of step, stopping: {steps}")
        return [v for _, v in got]

    def start_together(self) -> None:
        """Every rank's device idle, then the ranks released together: a CPU
        barrier, then a meeting on the devices, waited for. The CPU side
        still leaves the ranks tens of microseconds apart (the run's
        start_skew_us), which a collective's first call waits out and its
        timing counts, while a bare peer copy waits for nobody."""
        self.cpu_barrier()
        if self.meet_on_device():
            torch.cuda.synchronize()

    def cpu_barrier(self) -> None:
        """Every rank's device idle, then a CPU barrier (the gloo group)."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._exchange("start", None)

    def meet_on_device(self) -> bool:
        """Enqueues a one-element NCCL all-reduce on `device_group`, which
        ends on every rank's device at nearly the same moment: work queued
        behind it (a graph's replays) starts together, whatever the CPUs'
        skew. False where there is no device group."""
        if self.device_group is None or not torch.cuda.is_available():
            return False
        if self._meeting is None:
            self._meeting = torch.zeros(1, device="cuda")
        dist.all_reduce(self._meeting, group=self.device_group)
        return True

    def start_skew_us(self, times: int = 50) -> dict:
        """How far apart the ranks leave start_together, and the CPU barrier
        alone (median and p90 over `times` starts, us, the latest rank's
        CLOCK_MONOTONIC against the earliest's)."""
        def skews(start):
            spans = []
            for _ in range(times):
                start()
                now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                stamps = self.gather(now)
                spans.append((max(stamps) - min(stamps)) / 1e3)
            return {"median": timing.percentile(spans, 50), "p90": timing.percentile(spans, 90)}

        return {"cpu_barrier": skews(self.cpu_barrier), "start_together": skews(self.start_together)}

    def gather(self, value) -> list:
        return self._exchange("value", value)

    def gather_errors(self, error: str | None) -> list:
        return self._exchange("error", error)

    def first_error(self, error: str | None) -> str | None:
        """The first rank's error, on every rank, or None when none failed."""
        return next((f"rank {r}: {e}" for r, e in enumerate(self.gather_errors(error)) if e), None)


def attempt(fn):
    """(fn(), None), or (None, the error's text)."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001  (recorded in the JSON; the run goes on)
        return None, f"{type(e).__name__}: {e}"[:500]


class Reference:
    """This rank's input data and NCCL's result on it, for one (op, size) at a
    time: random integers in [-8, 8], different on every rank, so sums of up
    to 32 ranks are exact in bf16 whatever the order."""

    def __init__(self, nccl_peer, device, rank: int, world: int, seed: int, max_bytes: int):
        self.nccl, self.device, self.rank, self.world, self.seed = nccl_peer, device, rank, world, seed
        self.data = torch.empty(max_bytes // DTYPE.itemsize, dtype=DTYPE, device=device)
        self.expected = torch.empty_like(self.data)
        self.key = None

    def get(self, op: str, nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
        ref_op = "all_gather" if op == PEER_COPY else op  # the peer copy moves an all-gather's bytes
        data = self.data[:input_numel(ref_op, nbytes, self.world)]
        if self.key != (ref_op, nbytes):
            self.key = None
            gen = torch.Generator(device=self.device)
            gen.manual_seed(zlib.crc32(f"{self.seed}/{self.rank}/{ref_op}/{nbytes}".encode()))
            data.random_(-8, 9, generator=gen)
            call = self.nccl.call(ref_op, None, nbytes)
            call.inp.copy_(data)
            result = call.run()
            self.expected[:result.numel()].copy_(result)
            torch.cuda.synchronize()
            self.key = (ref_op, nbytes)
        return data, self.expected


def check(call, data: torch.Tensor, expected: torch.Tensor, ranks: Ranks) -> bool:
    """Runs `call` once on `data` into NaN-poisoned outputs: equal to NCCL's?"""
    if call.poison is not None:  # first: an in-place all-gather's input lies inside its output
        call.poison.fill_(float("nan"))
    call.inp.copy_(data)
    ranks.start_together()  # every rank's input written before any peer reads it
    result = call.run()
    torch.cuda.synchronize()
    return torch.equal(call.compared(result), call.compared(expected[:result.numel()]))


def measure(peer, variant, op: str, nbytes: int, modes: list[str], args, ranks: Ranks, reference: Reference,
            symm_collectives, row, algorithms=None) -> list[dict]:
    """The result rows of one cell, one per mode, from `row(mode, per_rank,
    **fields)`. `symm_collectives()`: symmpool's count of the collectives it
    ran in this process; `algorithms()`, if given: its counts by algorithm,
    of which a row keeps what grew while it was timed (`algorithms_ran`)."""
    call, error = attempt(lambda: peer.call(op, variant, nbytes))
    error = ranks.first_error(error)
    if error:
        return [row(m, unavailable=f"setup: {error}") for m in modes]
    ok, error = attempt(lambda: check(call, *reference.get(op, nbytes), ranks))
    error = ranks.first_error(error)
    if error:
        return [row(m, unavailable=f"check: {error}") for m in modes]
    correct = all(ranks.gather(ok))
    rows = []
    for mode in modes:
        before = symm_collectives()
        algorithms_before = algorithms() if algorithms else {}
        host = []  # eager only: the host's per-call us
        if mode == "eager":
            issued = args.warmup + args.iters * args.reps
            samples, error = attempt(lambda: timing.time_eager(call.run, args.iters, args.reps, args.warmup,
                                                               ranks.start_together, host=host))
        else:  # the replays run captured work: only the warm-up and the capture pass the router
            issued = timing.GRAPH_WARMUP_CALLS + args.graph_calls
            samples, error = attempt(lambda: timing.time_graph(call.run, args.graph_calls, args.reps,
                                                               ranks.start_together, args.graph_replays,
                                                               meet=ranks.meet_on_device))
        ran = symm_collectives() - before
        if algorithms:
            extra_counts = {"algorithms_ran": {a: n - algorithms_before.get(a, 0) for a, n in algorithms().items()
                                               if n != algorithms_before.get(a, 0)}}
        else:
            extra_counts = {}
        error = ranks.first_error(error)
        if error:
            rows.append(row(mode, correct=correct, unavailable=f"{mode}: {error}"))
            continue
        per_rank = ranks.gather(samples)
        extra = {"host_us_median": timing.host_median(ranks.gather(host))} if mode == "eager" else {}
        rows.append(row(mode, per_rank, correct=correct, calls_issued=issued, symm_collectives=ran, **extra,
                        **extra_counts))
    return rows
