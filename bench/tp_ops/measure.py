"""One shape on every rank: NCCL's unfused reference, each peer's check
against it, then the timing, the peers interleaved. Every step ends with the
ranks agreeing (bench/peers' cells.Ranks, over a CPU gloo group) on whether
it failed anywhere, so a failure on one rank skips that peer on all of them
instead of leaving the others waiting in a collective."""

from __future__ import annotations

from typing import Callable

import torch

import timing  # bench/peers
from cells import attempt  # bench/peers


def rotation(names: list, rep: int) -> list:
    """The order of repetition `rep`: each peer goes first in turn, so that
    drift over the run (clocks, temperature) spreads over all of them."""
    i = rep % len(names) if names else 0
    return names[i:] + names[:i]


def reference(call, ranks) -> dict:
    """One run of NCCL's unfused op on the check data: its results, kept."""
    ranks.start_together()
    results = call.run()
    torch.cuda.synchronize()
    return {name: t.clone() for name, t in results.items()}


def check(call, expected: dict, ranks, protect: tuple = ()) -> bool:
    """One run into NaN-poisoned outputs, its own inputs copied from the
    reference's: is every result it returns equal to the reference's?
    Afterwards its results are poisoned too (all but those sharing storage
    with `protect` or its own inputs): an output that a later peer's op
    allocates may be this one's freed block, which would still hold the
    right answer had that op written nothing."""
    for name, t in call.inputs.items():
        t.copy_(expected[name])
    for t in call.poison:
        t.fill_(float("nan"))
    ranks.start_together()  # every rank's inputs written before a peer reads them
    results = call.run()
    torch.cuda.synchronize()
    same = [torch.equal(t, expected[name]) for name, t in results.items() if t is not None]
    kept = {t.untyped_storage().data_ptr() for t in (*protect, *call.inputs.values())}
    for t in results.values():
        if t is not None and t.untyped_storage().data_ptr() not in kept:
            t.fill_(float("nan"))
    torch.cuda.synchronize()
    return bool(same) and all(same)


def time_interleaved(calls: dict, args, ranks, counter: Callable[[], int]) -> tuple[dict, dict, dict, dict]:
    """--reps rounds; in each, every peer's --warmup calls then --iters calls
    between CUDA events (bench/peers' time_eager, the ranks started together
    first), peers in rotation. Returns ({peer: per-call us of each round},
    {peer: why it stopped}, {peer: counter() increase during its calls},
    {peer: the host's per-call us of each round})."""
    samples, errors, ran = {p: [] for p in calls}, {}, dict.fromkeys(calls, 0)
    host = {p: [] for p in calls}
    for rep in range(args.reps):
        for peer in rotation(list(calls), rep):
            if peer in errors:
                continue
            before = counter()
            sample, error = attempt(lambda: timing.time_eager(calls[peer].run, args.iters, 1, args.warmup,
                                                              ranks.start_together, host=host[peer])[0])
            ran[peer] += counter() - before
            error = ranks.first_error(error)
            if error:
                errors[peer] = f"timing, repetition {rep + 1}: {error}"
            else:
                samples[peer].append(sample)
    return samples, errors, ran, host


def check_all(ready: dict, expected: dict, ranks, protect: tuple = ()) -> tuple[dict, dict]:
    """({peer: whether its result equals the reference's on every rank},
    {peer: why its check could not run})."""
    correct, failed = {}, {}
    for peer, call in ready.items():
        ok, error = attempt(lambda: check(call, expected, ranks, protect))
        error = ranks.first_error(error)
        if error:
            failed[peer] = f"check: {error}"
        else:
            correct[peer] = all(ranks.gather(ok))
    return correct, failed


def measure_shape(calls: dict, reference_call, fill_check: Callable[[], None],
                  fill_timing: Callable[[list], None], args, ranks, counter: Callable[[], int],
                  shared_inputs: tuple = ()) -> dict:
    """{peer: outcome} for the peers in `calls` ({peer: Call, or why it could
    not be set up}). An outcome: status ("ok", "wrong", "unavailable"),
    reason, correct, per_rank (each rank's per-call us of every round),
    calls_issued and counted (counter()'s increase while it was timed, on
    this rank)."""
    def unavailable(reason, **extra):
        return {"status": "unavailable", "reason": reason, **extra}

    out = {p: unavailable(f"setup: {c}") for p, c in calls.items() if isinstance(c, str)}
    ready = {p: c for p, c in calls.items() if not isinstance(c, str)}

    def reference_on_check_data():
        fill_check()
        return reference(reference_call, ranks)
    expected, error = attempt(reference_on_check_data)
    error = ranks.first_error(error)
    if error:
        return {**out, **{p: unavailable(f"reference (nccl-unfused): {error}") for p in ready}}
    correct, failed = check_all(ready, expected, ranks, protect=shared_inputs)
    out.update({p: unavailable(why) for p, why in failed.items()})
    expected = None  # not needed while timing
    timed = {p: ready[p] for p in correct}
    _, error = attempt(lambda: fill_timing([t for call in timed.values() for t in call.inputs.values()]))
    error = ranks.first_error(error)
    samples, errors, ran, host = time_interleaved(timed, args, ranks, counter) if not error else ({}, {}, {}, {})
    per_rank, host_per_rank = ranks.gather(samples), ranks.gather(host)
    for peer in timed:
        if error or peer in errors:
            out[peer] = unavailable(f"timing data: {error}" if error else errors[peer], correct=correct[peer])
            continue
        out[peer] = {"status": "ok" if correct[peer] else "wrong",
                     "reason": None if correct[peer] else "result differs from nccl-unfused's",
                     "correct": correct[peer], "per_rank": [rank[peer] for rank in per_rank],
                     "host_per_rank": [rank.get(peer, []) for rank in host_per_rank],
                     "calls_issued": args.reps * (args.warmup + args.iters), "counted": ran[peer]}
    return {p: out[p] for p in calls}
