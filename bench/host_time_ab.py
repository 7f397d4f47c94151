"""Merges bench/host_time.py runs of several modes (one process per run,
runs of each mode interleaved with the others') into one JSON: per mode and
case, the median over processes of each process's median host us per call,
the lowest and highest process median (the spread between processes), and
every process's median. With --trace, also each step's median host us from
the TRACE lines of rank 0 in logs of runs under SYMMPOOL_DEBUG=TRACE
SYMMPOOL_DEBUG_SUBSYS=TP (the first call of each op left out).

    python bench/host_time_ab.py --what "..." --out bench/results/<name>.json \\
        one-step=run1.json,run3.json pipelined=run2.json,run4.json \\
        --trace one-step-256=trace.log
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics


def merge(modes: dict[str, list[str]]) -> tuple[dict, list[dict]]:
    """(the first run's context, rows of mode x case)."""
    rows, context = [], None
    for mode, paths in modes.items():
        per_case: dict[str, list[float]] = {}
        for path in paths:
            with open(path) as f:
                run = json.load(f)
            context = context or run["context"]
            for row in run["results"]:
                per_case.setdefault(row["case"], []).append(row["host_us_median"])
        for case, medians in per_case.items():
            rows.append({"mode": mode, "case": case, "processes": len(medians),
                         "host_us_median": statistics.median(medians), "host_us_lowest": min(medians),
                         "host_us_highest": max(medians), "process_medians": medians})
    return context, rows


def trace_steps(path: str) -> list[dict]:
    """Each (op, step)'s median host us over rank 0's TRACE lines in `path`."""
    steps: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            if "[rank 0]" not in line or " host us:" not in line:
                continue
            op = line.split("TRACE TP ", 1)[1].split(" host us:", 1)[0]
            for step, us in re.findall(r" (\S+)=([\d.]+)", line.split(" host us:", 1)[1]):
                steps[(op, step)].append(float(us))
    return [{"op": op, "step": step, "calls": len(us) - 1, "us_median": statistics.median(us[1:])}
            for (op, step), us in steps.items() if len(us) > 1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--what", required=True, help="what was measured, and how (goes into the context)")
    p.add_argument("--out", required=True)
    p.add_argument("--trace", action="append", default=[], help="LABEL=trace.log (repeatable)")
    p.add_argument("modes", nargs="+", help="MODE=run.json[,run.json...]")
    args = p.parse_args()
    modes = {}
    for spec in args.modes:
        mode, sep, paths = spec.partition("=")
        if not sep or not paths:
            p.error(f"expected MODE=run.json[,run.json...], got {spec!r}")
        modes[mode] = paths.split(",")
    context, rows = merge(modes)
    context = {k: v for k, v in context.items() if k not in ("what", "cases")}
    context.update(what=args.what, summary="per mode and case: median over processes of each process's median "
                   "host us per call; lowest and highest process median")
    out = {"context": context, "results": rows}
    for spec in args.trace:
        label, sep, path = spec.partition("=")
        if not sep or not path:
            p.error(f"expected LABEL=trace.log, got {spec!r}")
        out.setdefault("steps", {})[label] = trace_steps(path)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    width = max(len(r["case"]) for r in rows)
    for r in rows:
        print(f"{r['mode']:<12} {r['case']:<{width}} {r['host_us_median']:>8.1f} "
              f"({r['host_us_lowest']:.1f}-{r['host_us_highest']:.1f}, {r['processes']} processes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
