"""Host time of one asynchronous collective call, from Python, as FSDP2 and a
training loop pay it: on a "nccl" group, on a "symm" group with plain tensors
(the call goes to NCCL) and on a "symm" group with symmpool tensors; and the
same calls on the groups' backend objects (nccl-backend, symm-backend), past
torch.distributed's Python wrapper, to tell its cost from the backends'.

    torchrun --standalone --nproc-per-node=2 bench/collectives_host_cost.py \
        --out bench/results/collectives_host_cost_h200x2_<date>.json

Each (op, path) is timed over --calls calls per repetition, repetitions
interleaved over the paths; the device is synchronized every --sync-every
calls so the host never waits for a full launch queue. Rank 0 writes the
JSON: per op and path, the median, p10 and p90 of the per-call host time over
all repetitions, and which engine ran (symmpool's counters). Refuses a tree
whose tracked files differ from its commit unless --allow-dirty
(bench/provenance.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, AllreduceOptions, ReduceScatterOptions

import provenance  # bench/, this script's folder
import symmpool

OPS = ("all_gather", "reduce_scatter", "all_reduce")
PATHS = ("nccl", "symm-plain", "symm-tensors")
# The same calls made on the group's backend object, past torch.distributed's
# Python wrapper: the difference is what the wrapper costs either way.
BACKEND_PATHS = ("nccl-backend", "symm-backend")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def make_buffers(op: str, path: str, backend, elements: int, world: int, device) -> tuple:
    """(input, output) of `elements` bf16 per rank, from symmpool for symm-tensors."""
    def empty(n):
        if path in ("symm-tensors", "symm-backend"):
            return backend.allocate_tensor(n, dtype=torch.bfloat16, device=device)
        return torch.empty(n, dtype=torch.bfloat16, device=device)

    if op == "all_gather":
        out = empty(elements * world)
        inp = out.narrow(0, dist.get_rank() * elements, elements)  # in place, as FSDP2 does
    elif op == "reduce_scatter":
        inp, out = empty(elements * world), empty(elements)
    else:
        inp = out = empty(elements)
    inp.normal_()
    if out is not inp:
        out.zero_()
    return inp, out


def call(op: str, inp, out, group):
    if not isinstance(group, dist.ProcessGroup):  # a backend object: its c10d methods directly
        if op == "all_gather":
            return group._allgather_base(out, inp, AllgatherOptions())
        if op == "reduce_scatter":
            opts = ReduceScatterOptions()
            opts.reduceOp = dist.ReduceOp.SUM
            return group._reduce_scatter_base(out, inp, opts)
        return group.allreduce([out], AllreduceOptions())
    if op == "all_gather":
        return dist.all_gather_into_tensor(out, inp, group=group, async_op=True)
    if op == "reduce_scatter":
        return dist.reduce_scatter_tensor(out, inp, group=group, async_op=True)
    return dist.all_reduce(out, group=group, async_op=True)


def time_calls(op: str, inp, out, group, calls: int, sync_every: int) -> list[float]:
    """Host microseconds of each call (until the async call returns)."""
    times = []
    for i in range(calls):
        start = time.perf_counter()
        work = call(op, inp, out, group)
        times.append((time.perf_counter() - start) * 1e6)
        del work
        if (i + 1) % sync_every == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=int, default=1 << 20, help="bytes per rank (bf16)")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--sync-every", type=int, default=10)
    p.add_argument("--paths", default=",".join(PATHS + BACKEND_PATHS),
                   help=f"comma-separated, from {', '.join(PATHS + BACKEND_PATHS)}")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, from {', '.join(OPS)}")
    p.add_argument("--out", help="JSON written by rank 0")
    provenance.add_allow_dirty(p)
    args = p.parse_args()
    tree = provenance.require_clean_tree(args.allow_dirty)
    paths, ops = args.paths.split(","), args.ops.split(",")
    unknown = [x for x in paths if x not in PATHS + BACKEND_PATHS] + [x for x in ops if x not in OPS]
    if unknown:
        p.error(f"unknown paths or ops: {', '.join(unknown)}")

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device)
    world, rank = dist.get_world_size(), dist.get_rank()
    nccl_group = dist.new_group(backend="nccl")
    symm_group = dist.new_group(backend=symmpool.BACKEND_NAME)
    backend = symm_group._get_backend(device)
    groups = {"nccl": nccl_group, "symm-plain": symm_group, "symm-tensors": symm_group,
              "nccl-backend": nccl_group._get_backend(device), "symm-backend": backend}
    elements = args.bytes // 2

    buffers = {(op, path): make_buffers(op, path, backend, elements, world, device) for op in ops for path in paths}
    for (op, path), (inp, out) in buffers.items():  # communicators, registration, first checks
        time_calls(op, inp, out, groups[path], args.warmup, args.sync_every)

    samples = {key: [] for key in buffers}
    engines = {}
    for _ in range(args.reps):  # interleaved: each path sees the same machine noise
        for op in ops:
            for path in paths:
                inp, out = buffers[(op, path)]
                before = symmpool.memory_stats(device)
                samples[(op, path)] += time_calls(op, inp, out, groups[path], args.calls, args.sync_every)
                after = symmpool.memory_stats(device)
                engines[(op, path)] = {
                    "symmpool_calls": after["symm_collectives"] - before["symm_collectives"],
                    "handed_to_nccl": after["nccl_fallbacks"] - before["nccl_fallbacks"],
                }

    results = []
    for (op, path), us in samples.items():
        results.append({"op": op, "path": path, "bytes_per_rank": args.bytes, "calls": len(us),
                        "host_us_median": statistics.median(us), "host_us_p10": percentile(us, 0.1),
                        "host_us_p90": percentile(us, 0.9), **engines[(op, path)]})
    if rank == 0:
        print(f"{'op':<15} {'path':<13} {'median us':>9} {'p10':>7} {'p90':>7}  engine (last repetition)")
        for r in results:
            engine = (f"symmpool {r['symmpool_calls']}, nccl {r['handed_to_nccl']}"
                      if r["path"].startswith("symm") else "nccl")
            print(f"{r['op']:<15} {r['path']:<13} {r['host_us_median']:>9.1f} {r['host_us_p10']:>7.1f} "
                  f"{r['host_us_p90']:>7.1f}  {engine}")
        if args.out:
            context = {
                "what": "host time of one async collective call from Python (torch.distributed), per path",
                **provenance.collect(state=tree), "ranks": world,
                "symmpool_collectives": os.environ.get("SYMMPOOL_COLLECTIVES") or "table",
                "reps": args.reps, "calls_per_rep": args.calls, "sync_every": args.sync_every,
            }
            with open(args.out, "w") as f:
                json.dump({"context": context, "results": results}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
