#!/usr/bin/env python3
"""Prints the peer tables of the README and bench/peers/README.md from a peer benchmark JSON: per op and
size, eager time per call in us of symmpool (the table's choice) / NCCL on
registered buffers / (where the file has it) NCCL in symmetric windows / the
fastest of torch's symm_mem ops / (all-gather only) the bare copy-engine peer
copy of the bytes a rank receives.

    python3 bench/peers/readme_table.py bench/results/peers_h200x2_2026-11-27_fused-reductions-every-size.json
"""
import argparse
import json
import sys

OPS = ("all_gather", "reduce_scatter", "all_reduce")
NAMES = {"all_gather": "all-gather", "reduce_scatter": "reduce-scatter", "all_reduce": "all-reduce"}


def size_name(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def cell_time(results: list[dict], op: str, nbytes: int, mode: str) -> list:
    """[symmpool, nccl-registered, (where `results` has it) nccl-window, best torch op,
    (all-gather) peer copy]: us or None."""
    def times(peer, variant_ok):
        return [r["time_us_median"] for r in results
                if r["op"] == op and r["bytes"] == nbytes and r["mode"] == mode and r["peer"] == peer
                and variant_ok(r.get("variant")) and r.get("time_us_median") is not None]

    def first(values):
        return values[0] if values else None

    row = [first(times("symmpool", lambda v: not v)), first(times("nccl-registered", lambda v: not v))]
    if any(r["peer"] == "nccl-window" for r in results):  # files from before it keep their columns
        row.append(first(times("nccl-window", lambda v: not v)))
    row.append(min(times("torch-symm-mem", lambda v: True), default=None))
    if op == "all_gather":
        row.append(first([r["time_us_median"] for r in results
                          if r["op"] == "peer_copy" and r["bytes"] == nbytes and r["mode"] == mode
                          and not r.get("variant") and r.get("time_us_median") is not None]))
    return row


def fmt(us) -> str:
    if us is None:
        return "-"
    return f"{us:.0f}" if us >= 1000 else f"{us:.1f}"


def table(results: list[dict], sizes: list[int], mode: str = "eager") -> str:
    lines = ["| op | " + " | ".join(size_name(s) for s in sizes) + " |",
             "| --- |" + " --- |" * len(sizes)]
    for op in OPS:
        cells = [" / ".join(fmt(t) for t in cell_time(results, op, s, mode)) for s in sizes]
        lines.append(f"| {NAMES[op]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json")
    p.add_argument("--sizes", default="67108864,268435456,1073741824", help="bytes, comma-separated")
    p.add_argument("--mode", default="eager", choices=("eager", "graph"))
    args = p.parse_args(argv)
    with open(args.json) as f:
        results = json.load(f)["results"]
    print(table(results, [int(s) for s in args.sizes.split(",")], args.mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
