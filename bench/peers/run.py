"""Peer benchmark: symmpool against NCCL (plain, on registered buffers, in symmetric windows),
torch's symmetric-memory ops and a bare peer copy, in one run, on the same
machine state: all-gather, reduce-scatter and all-reduce of bf16, eager and
in CUDA graphs, one process per GPU.

    torchrun --standalone --nproc-per-node=2 bench/peers/run.py \\
        --out bench/results/peers_h200x2_<date>.json

Sizes are bytes of the all-gather output, the reduce-scatter input, the
all-reduce buffer. Before timing, each (peer, op, size) runs once on
rank-dependent random small integers (exact in bf16 sums) into NaN-poisoned
outputs and is compared with NCCL's result on the same data (torch.equal).
Eager: CUDA events around --iters back-to-back calls after --warmup, the ranks
started together (devices synchronized, a CPU barrier, an NCCL all-reduce on
the devices) before each of --reps repetitions. Graph: --graph-calls calls
captured in one CUDA graph, --graph-replays replays per repetition. Times are per call: the median, p10 and p90 over repetitions
of the slowest rank's. Rank 0 writes the JSON after every size (a killed job
keeps what it had), then a PNG next to it (plot.py). An op a peer lacks, or
one that raises, is recorded as unavailable with the reason. Exit status 1
when a result differs from NCCL's or a call did not run where its peer says
(symmpool's counter of the collectives it ran tells). Refuses a tree whose
tracked files differ from its commit unless --allow-dirty (bench/provenance.py).
"""

from __future__ import annotations

import os

# NVLink multicast must stay off on the target machines, set before torch,
# NCCL or symmpool read it; SYMMPOOL_COLLECTIVES=always before symmpool is
# imported (peers.make_peers sets it again around each "symm" group).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
                 "SYMMPOOL_DISABLE_MULTICAST": "1"}
ENV_OF_NOTE = (*MULTICAST_OFF, "SYMMPOOL_COLLECTIVES", "SYMMPOOL_ALL_REDUCE_ALGORITHM",
               "SYMMPOOL_REDUCE_SCATTER_ALGORITHM", "SYMMPOOL_TWO_STEP_PIECE_BYTES")
INHERITED_ENV = {k: os.environ.get(k) for k in ENV_OF_NOTE}
os.environ.update(MULTICAST_OFF)
os.environ["SYMMPOOL_COLLECTIVES"] = "always"

import argparse  # noqa: E402
import datetime  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(ROOT, "bench"))

import provenance  # noqa: E402  (bench/)
import timing  # noqa: E402
from peers import (ALL_GATHER_IN_PLACE, ALL_REDUCE_ALGORITHMS, NCCL_PEERS, OPS, PEER_COPY, PEERS,  # noqa: E402
                   SYMMPOOL_OP, SYMMPOOL_OP_IN_PLACE, SYMMPOOL_OP_MAX_BYTES)
from run_output import finish_run, write_json  # noqa: E402

NVLINK_GBPS_PER_DIRECTION = 478  # H200's NVLink limit per GPU per direction (the target machine's)
UNITS = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GIB": 1 << 30}
SIZE_QUANTUM = 256  # bytes: every rank's chunk stays 16-byte aligned up to 16 ranks


def parse_size(text: str) -> int:
    """"4K", "4KiB", "16M", "1G", "4096" -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS:
        raise ValueError(f"not a size: {text!r} (a number with K, M or G, e.g. 64K)")
    return int(m.group(1)) * UNITS[m.group(2).upper()]


def parse_sizes(text: str) -> list[int]:
    """"1K:1G" (powers of 4 from 1 KiB to 1 GiB), "1K:1M:2" (factor 2) or a
    list "1K,64K,1G" -> sorted distinct byte counts."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"not a size range: {text!r} (LOW:HIGH or LOW:HIGH:FACTOR)")
        low, high = parse_size(parts[0]), parse_size(parts[1])
        factor = int(parts[2]) if len(parts) == 3 else 4
        if factor < 2 or low < 1 or high < low:
            raise ValueError(f"bad size range {text!r}: need 1 <= LOW <= HIGH and FACTOR >= 2")
        sizes = []
        while low <= high:
            sizes.append(low)
            low *= factor
    else:
        sizes = [parse_size(s) for s in text.split(",") if s.strip()]
    bad = [s for s in sizes if s <= 0 or s % SIZE_QUANTUM]
    if not sizes or bad:
        raise ValueError(f"sizes must be positive multiples of {SIZE_QUANTUM} bytes, got {bad or 'none'}")
    return sorted(set(sizes))


def parse_names(text: str, known: tuple, what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"unknown {what}: {', '.join(unknown) or '(none given)'}; known: {', '.join(known)}")
    return list(dict.fromkeys(names))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="JSON written by rank 0 (default: bench/results/peers_<gpu>x<N>_<date>.json)")
    p.add_argument("--sizes", default="1K:1G", help="LOW:HIGH[:FACTOR] (default factor 4) or a list, e.g. 1K,1M")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}")
    p.add_argument("--iters", type=int, default=20, help="back-to-back calls per eager repetition")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions per (peer, op, size, mode)")
    p.add_argument("--warmup", type=int, default=5, help="eager calls before the timed ones")
    p.add_argument("--graph", action=argparse.BooleanOptionalAction, default=True,
                   help="also time CUDA-graph replays (sizes up to --graph-max-bytes)")
    p.add_argument("--graph-max-bytes", default="8M", help="largest size timed in graphs")
    p.add_argument("--graph-calls", type=int, default=20, help="calls captured in one graph")
    p.add_argument("--graph-replays", type=int, default=10, help="back-to-back replays per graph repetition")
    p.add_argument("--time-budget", type=float,
                   help="seconds: start no (peer, op, size) past it; the rest is recorded as unavailable")
    p.add_argument("--two-step-pieces", default="32M",
                   help="symmpool's two-step reduce-scatter and all-reduce, one variant per piece size "
                        "(SYMMPOOL_TWO_STEP_PIECE_BYTES), e.g. 2M,8M,32M; '' for none")
    p.add_argument("--two-step-from", default="1M", help="smallest size the two-step variants are timed at")
    p.add_argument("--all-reduce-algorithms", default="",
                   help=f"symmpool all-reduce variants, one per algorithm (SYMMPOOL_ALL_REDUCE_ALGORITHM), of "
                        f"{', '.join(ALL_REDUCE_ALGORITHMS)}; '' for none")
    p.add_argument("--algorithms-up-to", default="8M", help="largest size the --all-reduce-algorithms are timed at")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plot", action="store_true")
    provenance.add_allow_dirty(p)
    args = p.parse_args(argv)
    try:
        args.sizes = parse_sizes(args.sizes)
        args.graph_max_bytes = parse_size(args.graph_max_bytes)
        args.ops = parse_names(args.ops, OPS, "ops")
        args.peers = parse_names(args.peers, PEERS, "peers")
        args.two_step_pieces = [parse_size(x) for x in args.two_step_pieces.split(",") if x.strip()]
        args.two_step_from = parse_size(args.two_step_from)
        args.algorithms_up_to = parse_size(args.algorithms_up_to)
        args.all_reduce_algorithms = parse_names(args.all_reduce_algorithms, ALL_REDUCE_ALGORITHMS,
                                                 "all-reduce algorithms") if args.all_reduce_algorithms.strip() else []
    except ValueError as e:
        p.error(str(e))
    if min(args.iters, args.reps, args.graph_calls, args.graph_replays) < 1 or args.warmup < 0:
        p.error("--iters, --reps, --graph-calls and --graph-replays must be >= 1, --warmup >= 0")
    return args


def plan(ops: list[str], peers: dict, failed: dict, names: list[str]) -> list[tuple[str, str, str | None]]:
    """(op, peer, variant) in the order they run at each size: every op,
    then the peer copy; peers in --peers order. Peers whose setup failed
    keep one entry per op (recorded as unavailable)."""
    series = []
    for op in ops + ([PEER_COPY] if "peer-copy" in names else []):
        for name in names:
            if name in failed:
                if (op == PEER_COPY) == (name == "peer-copy"):
                    series.append((op, name, None))
            else:
                series += [(op, name, v) for v in peers[name].variants(op)]
    return series


def result_row(peer: str, variant, op: str, nbytes: int, mode: str, world: int, per_rank: list | None,
               correct: bool | None = None, unavailable: str | None = None, **extra) -> dict:
    """One line of the JSON: `per_rank` holds each rank's per-call
    microseconds of every repetition (None when it did not run)."""
    stats = timing.summarize(per_rank) if per_rank else {"time_us_median": None, "time_us_p10": None,
                                                         "time_us_p90": None}
    algbw, busbw = timing.bandwidth(op, nbytes, stats["time_us_median"], world)
    return {"peer": peer, "variant": variant, "op": op, "bytes": nbytes, "mode": mode, **stats,
            "busbw_gbps": busbw, "algbw_gbps": algbw, "correct": correct, "unavailable": unavailable, **extra}


def document(context: dict, results: list[dict]) -> dict:
    return {"context": context, "results": results}


def default_out(gpu_name: str, world: int) -> str:
    gpu = (gpu_name.lower().replace("nvidia", "").split() or ["gpu"])[0]
    return os.path.join(ROOT, "bench", "results", f"peers_{gpu}x{world}_{datetime.date.today().isoformat()}.json")


def context_of(args, world: int, device, tree: dict | None = None) -> dict:
    """`tree`: provenance.require_clean_tree's (else asked here)."""
    import torch
    import torch.distributed as dist

    return {
        "what": "per-call time of bf16 collectives per peer, eager and in CUDA graphs (bench/peers)",
        **provenance.collect(state=tree), "gpu": torch.cuda.get_device_name(device), "ranks": world,
        "nccl_runtime": ".".join(map(str, dist.ProcessGroupNCCL.get_runtime_nccl_version())),
        "env": {k: os.environ.get(k) for k in ENV_OF_NOTE},
        "inherited_env": INHERITED_ENV, "nvlink_gbps_per_direction": NVLINK_GBPS_PER_DIRECTION,
        "dtype": "bfloat16", "sizes": args.sizes, "ops": args.ops, "peers": args.peers, "iters": args.iters,
        "reps": args.reps, "warmup": args.warmup, "graph": args.graph, "graph_max_bytes": args.graph_max_bytes,
        "graph_calls": args.graph_calls, "graph_replays": args.graph_replays,
        "graph_warmup_calls": timing.GRAPH_WARMUP_CALLS,
        "host_floor": "this rank's eager time and host time per call of a torch op alone (host_floor())",
        "start": "before each repetition: devices synchronized, a CPU (gloo) barrier, then a one-element NCCL "
                 "all-reduce on the devices, waited for (cells.Ranks.start_together; start_skew_us: how far "
                 "apart the CPUs leave it, and the CPU barrier alone); graphs also enqueue a second such "
                 "all-reduce right before the start event, so their replays start together on the devices "
                 "(since 2026-11-27; before, the CPU barrier alone and one replay a repetition)",
        "time_budget_s": args.time_budget, "seed": args.seed,
        "bytes": "all-gather output, reduce-scatter input, all-reduce buffer",
        "busbw": "nccl-tests: algbw * (n-1)/n (all-gather, reduce-scatter, peer copy), * 2(n-1)/n (all-reduce)",
        "time": "per call, us: median, p10, p90 over repetitions of the slowest rank's time",
        "correct": "one eager call per (peer, op, size) before timing, on NaN-poisoned outputs, torch.equal "
                   "to NCCL's result on the same data (random integers in [-8, 8])",
        "nccl_peers": {n: how for n, how in NCCL_PEERS.items() if n == "nccl" or n in args.peers},
        "peer_copy": "each rank pulls, from every other rank's torch symm_mem buffer, the chunk it receives "
                     "in an all-gather of this size (copy_ of get_buffer views: cudaMemcpyAsync), ranks at once; "
                     "busbw_gbps is GB/s per direction",
        "symmpool_variants": "rows of peer symmpool with a variant ran through another \"symm\" group made while "
                             "SYMMPOOL_*_ALGORITHM named it (and SYMMPOOL_TWO_STEP_PIECE_BYTES its piece), on the "
                             "same buffers; no variant: the algorithm table's choice",
        "symmpool_op": f"rows of peer symmpool with variant {SYMMPOOL_OP!r}: torch.ops.symmpool.all_reduce (a C++ "
                       "op, no torch.distributed Python wrapper; out of place, straight into a new tensor, no "
                       "Work, since 8aec56e) on the same group "
                       f"and input, up to {SYMMPOOL_OP_MAX_BYTES} bytes",
        "symmpool_op_in_place": f"rows of peer symmpool with variant {SYMMPOOL_OP_IN_PLACE!r}: "
                                "torch.ops.symmpool.all_reduce_, the same op in place on the peer's own symmetric "
                                "buffer (no output to allocate), at every size, by the table's algorithm",
        "all_gather_in_place": f"rows with variant {ALL_GATHER_IN_PLACE!r} (symmpool and the NCCL peers): the "
                               "all-gather as FSDP2 calls it, each rank's input its own slice of the output, on the "
                               "peer's own group and buffers; without it the input is a buffer of its own",
        "two_step_pieces": args.two_step_pieces, "two_step_from_bytes": args.two_step_from,
        "all_reduce_algorithms": args.all_reduce_algorithms, "algorithms_up_to_bytes": args.algorithms_up_to,
        "algorithms_ran": "per row: symmpool's collectives by the algorithm that ran them during that timing "
                          "(every peer's row: another peer's should show none)",
        "symm_collectives": "per row: the process's symmpool-run collectives during that timing (symmpool: "
                            "should equal calls_issued; graph replays are not counted, captures are)",
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    tree = provenance.require_clean_tree(args.allow_dirty)
    import torch
    import torch.distributed as dist

    import cells
    import symmpool
    from peers import TorchSymmMemPeer, deregister, make_peers

    device, world, rank, ranks = cells.start_ranks()
    misaligned = [s for s in args.sizes if s % (16 * world)]
    if misaligned:
        print(f"sizes must be multiples of 16 * {world} ranks: {misaligned}", file=sys.stderr)
        dist.destroy_process_group()
        return 2

    peers, failed = make_peers(args.peers, symmpool.BACKEND_NAME, device, world, rank, max(args.sizes),
                               args.two_step_pieces, args.all_reduce_algorithms)
    for setup in ranks.gather(failed):  # a peer that failed on any rank is left out on every rank
        failed.update(setup)
    context = context_of(args, world, device, tree)
    context["setup_failures"] = failed
    context["start_skew_us"] = ranks.start_skew_us()
    context["host_floor"] = host_floor(args, ranks, device)
    if "torch-symm-mem" not in failed and any(n in args.peers for n in ("torch-symm-mem", "peer-copy")):
        import torch.distributed._symmetric_memory as symm_mem

        context["torch_symm_mem_backend"] = symm_mem.get_backend(device)
    out = args.out or default_out(context["gpu"], world)
    reference = cells.Reference(peers["nccl"], device, rank, world, args.seed, max(args.sizes))

    def symm_collectives():
        return symmpool.memory_stats(device)["symm_collectives"]

    start, results = time.monotonic(), []
    for nbytes in args.sizes:
        modes = ["eager"] + (["graph"] if args.graph and nbytes <= args.graph_max_bytes else [])
        for op, name, variant in plan(args.ops, peers, failed, args.peers):
            if skipped(name, variant, nbytes, args):
                continue
            def row(mode, per_rank=None, **fields):
                return result_row(name, variant, op, nbytes, mode, world, per_rank, **fields)

            why = failed.get(name) or (TorchSymmMemPeer.missing(variant) if name == "torch-symm-mem" else None)
            if not why and args.time_budget is not None and \
                    any(ranks.gather(time.monotonic() - start > args.time_budget)):
                why = f"time budget ({args.time_budget:g} s) spent"
            if why:
                results += [row(m, unavailable=why) for m in modes]
                continue
            results += cells.measure(peers[name], variant, op, nbytes, modes, args, ranks, reference,
                                     symm_collectives, row, algorithms=symmpool._C.algorithm_counts)
        if rank == 0:
            write_json(out, document(context, results))
    # Ranks in step here (every cell ended agreeing); a failure is kept, not raised.
    context["deregistration_error"] = cells.attempt(lambda: deregister(peers, failed))[1]
    del peers, reference  # buffers go before their groups
    torch.cuda.synchronize()
    stats = symmpool.memory_stats(device)
    context["elapsed_s"] = round(time.monotonic() - start, 1)
    context["problems"] = problems(results)
    context["symmpool_stats"] = {k: stats[k] for k in ("symm_collectives", "nccl_fallbacks",
                                                       "nccl_registered_segments", "nccl_registered_bytes")}
    context["symmpool_routing_counts"] = symmpool._C.routing_counts()
    if rank == 0:
        finish_run(out, document(context, results), table(results), context["problems"], plot=not args.no_plot)
    dist.destroy_process_group()
    return 1 if context["problems"] else 0


def host_floor(args, ranks, device) -> dict:
    """An eager op with nothing to do across ranks, timed as the cells are:
    the host time of one torch call on this machine, under which no eager
    collective through torch can go (x.add_(1) on 1 KiB of bf16)."""
    import torch

    x = torch.zeros(512, dtype=torch.bfloat16, device=device)
    host = []
    samples = timing.time_eager(lambda: x.add_(1), args.iters, args.reps, args.warmup, ranks.start_together,
                                host=host)
    return {"op": "add_ of 1 KiB bf16", "time_us_median": timing.percentile(samples, 50),
            "host_us_median": timing.percentile(host, 50)}


def skipped(peer: str, variant, nbytes: int, args) -> bool:
    """Cells not timed: symmpool's two-step pipelines below --two-step-from
    (a pipeline of copies is for large messages), its algorithm variants
    above --algorithms-up-to, its functional op above
    the sizes its low-latency all-reduce takes in any memory (larger, the op's
    plain output goes to NCCL; the in-place op, on symmetric buffers, runs
    at every size)."""
    if peer != "symmpool" or variant in (None, ALL_GATHER_IN_PLACE, SYMMPOOL_OP_IN_PLACE):
        return False
    if variant == SYMMPOOL_OP:
        return nbytes > SYMMPOOL_OP_MAX_BYTES
    if variant in ALL_REDUCE_ALGORITHMS:
        return nbytes > args.algorithms_up_to
    return nbytes < args.two_step_from


def problems(results: list[dict]) -> list[str]:
    """Rows that are wrong, or that did not run where their peer says: a
    symmpool row whose calls did not all run on symmpool (or, for a variant,
    on its algorithm), another peer's row with calls that did. Unavailable
    rows are not problems."""
    out = []
    for r in results:
        where = f"{r['peer']} {r['variant'] or ''} {r['op']} {r['bytes']} B {r['mode']}".replace("  ", " ")
        if r["correct"] is False:
            out.append(f"{where}: result differs from NCCL's")
        if r.get("symm_collectives") is None:
            continue
        expected = r["calls_issued"] if r["peer"] == "symmpool" else 0
        if r["symm_collectives"] != expected:
            out.append(f"{where}: {r['symm_collectives']} of {r['calls_issued']} calls ran on symmpool, "
                       f"expected {expected}")
        if r["peer"] == "symmpool" and r["variant"] not in (None, ALL_GATHER_IN_PLACE, SYMMPOOL_OP_IN_PLACE) \
                and "algorithms_ran" in r:
            # The functional op is timed where low-latency takes its plain output;
            # the other variants are named after their algorithm (the in-place
            # op and the table's rows run whatever the table picks).
            algorithm = "low-latency" if r["variant"] == SYMMPOOL_OP else r["variant"].split()[0]
            if r["algorithms_ran"] != {algorithm: r["calls_issued"]}:
                out.append(f"{where}: ran {r['algorithms_ran']}, expected {r['calls_issued']} x {algorithm}")
    return out


def table(results: list[dict]) -> str:
    """One line per row: what a log reader needs to see at a glance."""
    lines = [f"{'op':<15} {'bytes':>11} {'mode':<6} {'peer':<16} {'variant':<31} {'us':>9} {'host us':>8} "
             f"{'busbw':>7}  ok"]

    def fmt(value):
        return "-" if value is None else f"{value:.1f}"
    for r in results:
        ok = r["unavailable"] or {True: "yes", False: "WRONG", None: "-"}[r["correct"]]
        lines.append(f"{r['op']:<15} {r['bytes']:>11} {r['mode']:<6} {r['peer']:<16} {r['variant'] or '':<31} "
                     f"{fmt(r['time_us_median']):>9} {fmt(r.get('host_us_median')):>8} {fmt(r['busbw_gbps']):>7}  {ok}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
