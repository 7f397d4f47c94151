"""Tensor-parallel fused ops benchmark: all-gather + matmul and matmul +
reduce-scatter of Llama-3 8B and 70B layers split over the ranks, on
symmpool's fused ops, NCCL unfused, torch's fused ops (async TP), the matmul
alone and the transfer alone, in one run on the same inputs, bf16, one
process per GPU.

    torchrun --standalone --nproc-per-node=2 bench/tp_ops/run.py \\
        --out bench/results/tp_ops_h200x2_<date>.json

Shapes (shapes.py): M = batch x seq in --tokens, K and N from the model's hidden
and MLP widths as column-parallel (all-gather + matmul: A_shard [M/W,
hidden], B [hidden, mlp/W]) and row-parallel (matmul + reduce-scatter: A [M,
mlp/W], B [mlp/W, hidden]) layers split them; --gather-dim / --scatter-dim
1 shards the sequence of [batch, seq, hidden] activations instead. A shape
whose buffers would not fit in memory is skipped.

Per shape: NCCL's unfused result on exact check data (data.py: small
integers, sums exact in bf16 whatever their order), then each peer once
into NaN-poisoned outputs where it takes them, compared with it
(torch.equal); then normal random data and --reps rounds in which every
peer, in turn (the order rotates each round), runs --warmup calls and
--iters calls between CUDA events, the ranks started together. Times are
per call: median, p10 and p90 over rounds of the slowest rank's. Rank 0
writes the JSON after every shape (a killed job keeps what it had), then a
PNG next to it (plot.py). A peer that lacks an op, or raises, is recorded as
unavailable with the reason; the run goes on. Exit status 1 when a result
differs from NCCL's or symmpool's transfer did not run on symmpool. Refuses a
tree whose tracked files differ from its commit unless --allow-dirty
(bench/provenance.py).
"""

from __future__ import annotations

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PEERS_DIR = os.path.join(ROOT, "bench", "peers")


def _load_peers_run():
    """bench/peers/run.py as module `peers_run` (this directory has a run.py
    too): its helpers and its list of multicast settings. Importing it turns
    NVLink multicast off and sets SYMMPOOL_COLLECTIVES=always before it
    imports torch; it puts bench/peers first on sys.path."""
    if "peers_run" not in sys.modules:
        spec = importlib.util.spec_from_file_location("peers_run", os.path.join(PEERS_DIR, "run.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["peers_run"] = module
        spec.loader.exec_module(module)
    return sys.modules["peers_run"]


sys.path[:0] = [HERE, PEERS_DIR]
peers_run = _load_peers_run()  # first: nothing has imported torch before it
sys.path.insert(0, HERE)  # ahead of bench/peers again: both have a plot.py
if any(os.environ.get(k) != v for k, v in peers_run.MULTICAST_OFF.items()):
    raise SystemExit(f"NVLink multicast must stay off: {peers_run.MULTICAST_OFF} not all set")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import cells  # noqa: E402  (bench/peers)
import data  # noqa: E402
import measure  # noqa: E402
import provenance  # noqa: E402  (bench/, on the path bench/peers/run.py set)
import report  # noqa: E402
import run_output  # noqa: E402  (bench/peers)
import shapes  # noqa: E402
import timing  # noqa: E402  (bench/peers)
import tp_peers  # noqa: E402
from tp_peers import PEERS, REFERENCE, SYMMPOOL_PEERS  # noqa: E402

ENV_OF_INTEREST = (*peers_run.ENV_OF_NOTE, "SYMMPOOL_DEBUG_ROUTING",
                   "CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_SYMM_MEM_ENABLE_NATIVE_ASYNC_TP",
                   "TORCH_SYMMMEM_IMPLICIT_POOL", "NCCL_ALGO", "NCCL_PROTO", "TORCH_NCCL_ASYNC_ERROR_HANDLING")


def parse_ints(text: str) -> list[int]:
    """"2048,8192" -> [2048, 8192], sorted, distinct, positive."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"not a list of whole numbers: {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"need positive whole numbers, got {text!r}")
    return sorted(set(values))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="JSON written by rank 0 (default: bench/results/tp_ops_<gpu>x<N>_<date>.json)")
    p.add_argument("--ops", default=",".join(shapes.OPS), help=f"comma-separated, of {', '.join(shapes.OPS)}")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}")
    p.add_argument("--models", default=",".join(shapes.MODELS), help=f"comma-separated, of {', '.join(shapes.MODELS)}")
    # Not "--m": under torchrun its own parser reads it as an ambiguous prefix of its options.
    p.add_argument("--tokens", dest="m", default=",".join(map(str, shapes.DEFAULT_M)),
                   help="M: tokens (batch x seq), comma-separated")
    p.add_argument("--gather-dim", type=int, choices=(0, 1), default=0,
                   help="all-gather + matmul: shard dim 0 of [M, hidden] or dim 1 (seq) of [batch, seq, hidden]")
    p.add_argument("--scatter-dim", type=int, choices=(0, 1), default=0,
                   help="matmul + reduce-scatter: the same for its output")
    p.add_argument("--batch", type=int, default=4, help="sequences per batch where a dim is 1 (seq = M / batch)")
    p.add_argument("--iters", type=int, default=10, help="back-to-back calls per timed round")
    p.add_argument("--reps", type=int, default=10, help="timed rounds per shape (peers interleaved)")
    p.add_argument("--warmup", type=int, default=3, help="calls before each timed round of a peer")
    p.add_argument("--time-budget", type=float,
                   help="seconds: start no shape past it; the rest is recorded as not run")
    p.add_argument("--memory-fraction", type=float, default=0.9,
                   help="skip a shape whose estimated need exceeds this part of the free memory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plot", action="store_true")
    provenance.add_allow_dirty(p)
    args = p.parse_args(argv)
    try:
        args.ops = peers_run.parse_names(args.ops, shapes.OPS, "ops")
        args.peers = peers_run.parse_names(args.peers, PEERS, "peers")
        args.models = peers_run.parse_names(args.models, tuple(shapes.MODELS), "models")
        args.m = parse_ints(args.m)
    except ValueError as e:
        p.error(str(e))
    if min(args.iters, args.reps, args.batch) < 1 or args.warmup < 0:
        p.error("--iters, --reps and --batch must be >= 1, --warmup >= 0")
    if not 0 < args.memory_fraction <= 1:
        p.error("--memory-fraction must be in (0, 1]")
    return args


def plan(args) -> list[tuple[str, str, int]]:
    """(op, model, M) in the order they run: model by model, M growing, both
    ops at each M (a run cut short by its budget has both ops of the shapes
    it reached)."""
    return [(op, model, m) for model in args.models for m in args.m for op in args.ops]


def budget_spent(elapsed: list[float], budget: float | None) -> str | None:
    """Why the next shape does not start, given every rank's elapsed seconds."""
    if budget is not None and max(elapsed) > budget:
        return f"time budget ({budget:g} s) spent"
    return None


def default_out(gpu_name: str, world: int) -> str:
    gpu = (gpu_name.lower().replace("nvidia", "").split() or ["gpu"])[0]
    return os.path.join(ROOT, "bench", "results", f"tp_ops_{gpu}x{world}_{datetime.date.today().isoformat()}.json")


def document(context: dict, cells: list[dict]) -> dict:
    return {"context": context, "cells": cells}


def context_of(args, world: int, device, tree: dict | None = None) -> dict:
    """`tree`: provenance.require_clean_tree's (else asked here)."""
    return {
        "what": "per-call time of tensor-parallel fused ops (bf16) per peer and shape (bench/tp_ops)",
        **provenance.collect(state=tree), "gpu": torch.cuda.get_device_name(device), "ranks": world,
        "env": {k: os.environ.get(k) for k in ENV_OF_INTEREST}, "inherited_env": peers_run.INHERITED_ENV,
        "bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "dtype": "bfloat16", "ops": args.ops, "peers": args.peers, "models": args.models, "m": args.m,
        "model_dims": {k: {"name": v.name, "hidden": v.hidden, "mlp": v.mlp} for k, v in shapes.MODELS.items()},
        "gather_dim": args.gather_dim, "scatter_dim": args.scatter_dim, "batch": args.batch, "iters": args.iters,
        "reps": args.reps, "warmup": args.warmup, "time_budget_s": args.time_budget,
        "memory_fraction": args.memory_fraction, "seed": args.seed, "target_ratio": report.TARGET_RATIO,
        "target": "fused <= target_ratio x matmul-alone where matmul-alone is longer than transfer-alone",
        "time": "per call, us: median, p10, p90 over rounds of the slowest rank's time; each round: --warmup "
                "calls, then --iters calls between CUDA events, ranks started together, peers in an order "
                "that rotates every round",
        "correct": "one call per (peer, shape) before timing, on NaN-poisoned outputs where the op takes "
                   "them, torch.equal to nccl-unfused's result on the same data: A random integers, B zero "
                   "but for a few rows of random integers, every sum exact in bf16 (bench/tp_ops/data.py); "
                   "timing runs on normal random data",
        "peer_notes": {
            "symmpool-fused": "torch.ops.symmpool fused op on a \"symm\" group made with "
                              "SYMMPOOL_COLLECTIVES=always, run under torch.cuda.use_mem_pool(symmpool.mem_pool())",
            "nccl-unfused": "all_gather_into_tensor / reduce_scatter_tensor on a \"nccl\" group and torch.matmul "
                            "into preallocated outputs (plus the copy between the sharded dim and dim 0 when "
                            "a dim is 1)",
            "torch-fused": "torch.ops.symm_mem fused op (return_A left True) on that \"nccl\" group",
            "matmul-alone": "torch.matmul of the whole A into a preallocated output",
            "transfer-alone": "torch.ops.symmpool.all_gather / reduce_scatter on the \"symm\" group, under "
                              "symmpool's pool; busbw_gbps as nccl-tests counts it",
            "inputs": "A and B of every peer: one pair per shape, allocated under symmpool's pool",
        },
    }


def setup_symmpool(names: list[str]) -> tuple[object, object, dict]:
    """(the symmpool module, its "symm" group, {peer: why not}): made only
    where a symmpool peer is asked for; a failure leaves those peers out."""
    wanted = [p for p in SYMMPOOL_PEERS if p in names]
    if not wanted:
        return None, None, {}
    try:
        import symmpool

        os.environ["SYMMPOOL_COLLECTIVES"] = "always"  # read when the symm backend is made
        return symmpool, dist.new_group(backend=symmpool.BACKEND_NAME), {}
    except Exception as e:  # noqa: BLE001  (recorded; the other peers still run)
        return None, None, dict.fromkeys(wanted, f"{type(e).__name__}: {e}"[:500])


def available_bytes(device, symmpool) -> int:
    """What this rank could still allocate: free device memory plus what
    torch's and symmpool's caches hold unused."""
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if symmpool is not None:
        s = symmpool.memory_stats(device)
        cached += s["reserved_bytes"]["current"] - s["allocated_bytes"]["current"]
    return free + cached


def every_peer(key, args, status: str, reason: str, shape=None, **extra) -> list[dict]:
    return [report.cell(key, shape, p, status, reason, **extra) for p in args.peers]


def run_shape(key, args, env) -> list[dict]:
    """The cells of one (op, model, M), one per peer in --peers: not run
    past the time budget, skipped where the ranks cannot split it or it
    would not fit, else measured. Its buffers and pool go back after."""
    op, model, m = key
    ranks = env["ranks"]
    why = budget_spent(ranks.gather(time.monotonic() - env["start"]), args.time_budget)
    if why:
        return every_peer(key, args, "not_run", why)
    dim = args.gather_dim if op == "all_gather_matmul" else args.scatter_dim
    try:
        shape = shapes.make_shape(op, model, m, env["world"], dim, args.batch)
    except shapes.Unfit as e:
        return every_peer(key, args, "skipped", str(e))
    estimate = sum(shapes.memory_terms(shape, args.peers).values())
    why = shapes.fits(estimate, ranks.gather(available_bytes(env["device"], env["symmpool"])), args.memory_fraction)
    if why:
        return every_peer(key, args, "skipped", why, shape, memory_estimate_bytes=estimate)
    rows = measure_cells(key, shape, args, env)
    for row in rows:
        row["memory_estimate_bytes"] = estimate
    gc.collect()  # the shape's tensors and pool died with measure_cells' frame
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return rows


def measure_cells(key, shape, args, env) -> list[dict]:
    """Inputs (from a new symmpool pool), every peer's call, the
    measurement (measure.py), the cells."""
    attempt, ranks, device, failed = cells.attempt, env["ranks"], env["device"], env["failed"]
    ag = shape.op == "all_gather_matmul"
    pool = None
    if env["symmpool"] is not None:
        pool, error = attempt(env["symmpool"].mem_pool)
        error = ranks.first_error(error)
        if error:  # the symmpool peers sit this shape out, the others run on plain memory
            failed = {**failed, **dict.fromkeys(SYMMPOOL_PEERS, f"symmpool.mem_pool(): {error}")}
            pool = None

    def allocate_inputs():
        with torch.cuda.use_mem_pool(pool) if pool is not None else contextlib.nullcontext():
            return tp_peers.Inputs(torch.empty(shape.a_shard if ag else shape.a, dtype=tp_peers.DTYPE, device=device),
                                   torch.empty(shape.b, dtype=tp_peers.DTYPE, device=device))
    inputs, error = attempt(allocate_inputs)
    error = ranks.first_error(error)
    if error:
        return every_peer(key, args, "unavailable", f"inputs: {error}", shape)

    def call_of(peer):
        call, error = attempt(lambda: tp_peers.make_call(peer, shape, inputs, env["groups"], pool))
        return ranks.first_error(error) or call
    calls = {p: failed.get(p) or call_of(p) for p in args.peers}
    reference = calls[REFERENCE] if REFERENCE in args.peers else call_of(REFERENCE)
    if isinstance(reference, str):
        return every_peer(key, args, "unavailable", f"reference (nccl-unfused) setup: {reference}", shape)
    gen = data.generator(device, args.seed, env["rank"], f"{shape.op}/{shape.model}/{shape.m}/{shape.dim}/{args.batch}")
    outcomes = measure.measure_shape(
        calls, reference, lambda: data.fill_check(inputs.a, inputs.b, 1 if ag else shape.world, gen),
        lambda own: data.fill_timing([inputs.a, inputs.b, *own], gen), args, ranks, env["counter"],
        shared_inputs=(inputs.a, inputs.b))
    return [report.cell(key, shape, peer, o["status"], o.get("reason"), o.get("per_rank"), o.get("correct"),
                        calls_issued=o.get("calls_issued"), symm_collectives=o.get("counted"),
                        host_us_median=timing.host_median(o.get("host_per_rank")))
            for peer, o in outcomes.items()]


def main(argv=None) -> int:
    args = parse_args(argv)
    tree = provenance.require_clean_tree(args.allow_dirty)
    device, world, rank, ranks = cells.start_ranks()
    nccl = dist.new_group(backend="nccl")
    symmpool, symm, failed = setup_symmpool(args.peers)
    for setup in ranks.gather(failed):  # a peer that failed on any rank is left out on every rank
        failed.update(setup)
    context = context_of(args, world, device, tree)
    context["setup_failures"] = failed
    if "torch-fused" in args.peers:
        context["torch_symm_mem_enable"] = tp_peers.enable_torch_symm_mem(nccl.group_name) or "ok"
    out = args.out or default_out(context["gpu"], world)
    env = {"ranks": ranks, "world": world, "rank": rank, "device": device, "symmpool": symmpool, "failed": failed,
           "groups": tp_peers.Groups(world, nccl, symm.group_name if symm is not None else None,
                                     symmpool.peer_memory_counts if symmpool else None),
           "counter": (lambda: symmpool.memory_stats(device)["symm_collectives"]) if symmpool else (lambda: 0),
           "start": time.monotonic()}
    results = []
    for key in plan(args):
        results += run_shape(key, args, env)
        report.add_ratios(results)
        if rank == 0:
            run_output.write_json(out, document(context, results))
    context["elapsed_s"] = round(time.monotonic() - env["start"], 1)
    context["problems"] = report.problems(results)
    if "torch-fused" in args.peers:
        import torch.distributed._symmetric_memory as symm_mem

        context["torch_symm_mem_backend"] = symm_mem.get_backend(device)
    if symmpool is not None:
        stats = symmpool.memory_stats(device)
        context["symmpool_stats"] = {k: stats[k] for k in ("symm_collectives", "nccl_fallbacks",
                                                           "nccl_registered_segments", "nccl_registered_bytes")}
        context["symmpool_routing_counts"] = symmpool._C.routing_counts()
    if rank == 0:
        run_output.finish_run(out, document(context, results), report.table(results), context["problems"],
                              plot=not args.no_plot)
    dist.destroy_process_group()
    return 1 if context["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
