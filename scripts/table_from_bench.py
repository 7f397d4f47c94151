#!/usr/bin/env python3
"""Reads a symmpool_collectives_bench JSON, or a peer benchmark JSON
(bench/peers/run.py), and prints what the algorithm table
(collectives/include/symmpool/algorithm_table.hpp) should say for its world
size: per op, the largest size up to which symmpool (its default algorithm)
is never slower than NCCL on the same registered buffers by more than the
tolerance, eager and in CUDA graphs, and which symmpool variant was fastest
at each size.

    python3 scripts/table_from_bench.py bench/results/peers_h200x2_2026-11-27_fused-reductions-every-size.json
"""
import argparse
import json
import re
import sys

OPS = ("AllGather", "ReduceScatter", "AllReduce")
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
# <Op>[Graph]/<impl>/<size>[/iterations:N/manual_time]
NAME = re.compile(r"^(?P<op>[A-Za-z]+?)(?P<graph>Graph)?/(?P<impl>[a-z0-9-]+)/(?P<size>\d+)(?P<unit>KiB|MiB|GiB)(/|$)")


def parse_times(benchmarks):
    """{(op, graph, impl, bytes): time in us} for the op families; skips the
    contention runs and anything else. Where a benchmark was repeated
    (--benchmark_repetitions), its median stands for it."""
    repeated = {b.get("run_name") for b in benchmarks if b.get("aggregate_name") == "median"}
    times = {}
    for b in benchmarks:
        m = NAME.match(b["name"])
        if not m or m["op"] not in OPS:
            continue
        if b.get("run_type", "iteration") == "aggregate":
            if b.get("aggregate_name") != "median":
                continue
        elif b.get("run_name") in repeated:
            continue
        scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b.get("time_unit", "us")]
        size = int(m["size"]) * UNITS[m["unit"]]
        times[(m["op"], bool(m["graph"]), m["impl"], size)] = b["real_time"] * scale
    return times


# The peer benchmark's ops and rows, by the names the C++ bench gives them:
# symmpool's own rows (no variant) against NCCL on the same registered
# buffers; symmpool's two-step rows as variants.
PEER_OPS = {"all_gather": "AllGather", "reduce_scatter": "ReduceScatter", "all_reduce": "AllReduce"}


def parse_peer_times(results):
    """parse_times for a peer benchmark's results: the median per call."""
    times = {}
    for r in results:
        op, t = PEER_OPS.get(r["op"]), r.get("time_us_median")
        if op is None or t is None:
            continue
        variant = r.get("variant") or ""
        if r["peer"] == "symmpool" and not variant:
            impl = "symmpool"
        elif r["peer"] == "symmpool" and variant.startswith("two-step"):
            impl = "symmpool-2step-" + variant.split()[-1].lower()
        elif r["peer"] == "nccl-registered" and not variant:
            impl = "nccl"
        else:
            continue
        times[(op, r["mode"] == "graph", impl, int(r["bytes"]))] = t
    return times


def limit_for(times, op, tolerance):
    """Largest measured size such that symmpool is within `tolerance` of NCCL
    at it and at every smaller size, eager or graph; None for every size,
    0 when it already loses at the smallest."""
    sizes = sorted({s for (o, _, impl, s) in times if o == op and impl == "nccl"})
    if not sizes:
        raise ValueError(f"no {op}/nccl results in the file")
    limit = None
    for size in sizes:
        for graph in (False, True):
            ours, theirs = times.get((op, graph, "symmpool", size)), times.get((op, graph, "nccl", size))
            if ours is None or theirs is None:
                continue
            if ours > theirs * (1 + tolerance):
                return limit if limit is not None else 0
        limit = size
    return None


def fastest_variants(times, op):
    """[(graph, bytes, fastest symmpool-* variant, its time, default's time)]"""
    rows = []
    for graph in (False, True):
        for size in sorted({s for (o, g, _, s) in times if o == op and g == graph}):
            variants = {impl: t for (o, g, impl, s), t in times.items()
                        if o == op and g == graph and s == size and impl.startswith("symmpool-")}
            default = times.get((op, graph, "symmpool", size))
            if variants and default is not None:
                best = min(variants, key=variants.get)
                rows.append((graph, size, best, variants[best], default))
    return rows


def cpp_size(limit):
    if limit is None:
        return "kAnySize"
    if limit % (1 << 20) == 0:
        return f"{limit >> 20} * kMiB"
    return str(limit)


def file_times(data):
    """The times of either kind of file."""
    if "results" in data:
        return parse_peer_times(data["results"])
    return parse_times(data["benchmarks"])


def table_entry(data, tolerance=0.01):
    """(world, {op: limit}) for the file."""
    world = int(data["context"]["ranks"])
    times = file_times(data)
    return world, {op: limit_for(times, op, tolerance) for op in OPS}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="symmpool_collectives_bench --benchmark_out file, or a bench/peers JSON")
    parser.add_argument("--tolerance", type=float, default=0.01,
                        help="symmpool may be this much slower than NCCL and still be chosen (default 0.01)")
    parser.add_argument("--variant-margin", type=float, default=0.05,
                        help="flag sizes where a variant beat the default algorithm by more (default 0.05)")
    args = parser.parse_args(argv)
    with open(args.json) as f:
        data = json.load(f)
    world, limits = table_entry(data, args.tolerance)
    times = file_times(data)
    for op in OPS:
        print(f"{op}: symmpool up to {cpp_size(limits[op])}")
        for graph, size, best, best_us, default_us in fastest_variants(times, op):
            slower = default_us / best_us - 1
            flag = f"   <- default {slower:.0%} slower" if slower > args.variant_margin else ""
            print(f"  {'graph' if graph else 'eager'} {size:>11} B: fastest {best} {best_us:.2f} us, "
                  f"default {default_us:.2f} us{flag}")
    print(f"{{{world}, {cpp_size(limits['AllGather'])}, {cpp_size(limits['ReduceScatter'])}, "
          f"{cpp_size(limits['AllReduce'])}}},")
    return 0


if __name__ == "__main__":
    sys.exit(main())
