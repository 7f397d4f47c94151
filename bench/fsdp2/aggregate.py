"""From the records of single runs to the benchmark's JSON shape, and its table.

A record is what run.py keeps of one (config, mode, repetition):
    {"config", "mode", "rep", "status": "ok" | "failed" | "timeout",
     "returncode", "wall_s", "reason", "log_tail", "result": worker.py's JSON or None}
Pure Python: no torch, so the CPU tests can feed it synthetic records.
"""

from __future__ import annotations

import math
import statistics

import numpy

import host_meter
from configs import MODES, model_fields, parse_config

GIB = 2**30
# Per-step host measurements that say why a host is slow (host_meter.py)
HOST_DIAGNOSTICS = host_meter.FIELDS
# A mode whose host time (until the step's calls return) is at least this
# share of its step is host-bound: its step time measures the host, not the
# collectives, and these hosts' speeds differ by up to 1.5x.
HOST_BOUND_FRACTION = 0.9
# What kept compute off the GPU while communication was exposed (comm_profile.exposed_by_cause)
EXPOSED_CAUSES = ("host_late", "comm_bound", "unattributed")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), interpolated linearly (numpy's default)."""
    if not values:
        raise ValueError("percentile of nothing")
    return float(numpy.percentile(values, q))


def _max_present(values):
    present = [v for v in values if v is not None]
    return max(present) if present else None


def slowest(ranks: list[dict], key: str) -> list:
    """Per step, the largest of the ranks' `key` values."""
    return [max(r[key][i] for r in ranks) for i in range(len(ranks[0][key]))]


def of_the_profile_with_most(profiles: list, rank_by: str, key: str):
    """`key` of the rank profile with the largest `rank_by` (None where no
    profile has `key`); ties pick one without comparing the values."""
    return max(((p.get(rank_by, 0.0), p[key]) for p in profiles if p and key in p),
               key=lambda pair: pair[0], default=(0.0, None))[1]


def per_rep(result: dict) -> dict:
    """One repetition's numbers: per step the slowest rank, per quantity the
    largest over ranks."""
    ranks = result["ranks"]
    profiles = [r.get("profile") for r in ranks]
    symm = [r.get("symmpool") for r in ranks]

    def of_the_most_exposed(key: str):
        return of_the_profile_with_most(profiles, "exposed_comm_ms_per_step", key)

    return {
        "step_ms": slowest(ranks, "step_ms"),
        "host_ms": slowest(ranks, "host_ms"),
        # results before 2026-11-26 lack these; per step, the rank that used most
        **{key: slowest(ranks, key) if all(key in r for r in ranks) else [] for key in HOST_DIAGNOSTICS},
        "device_peak_bytes": _max_present(r.get("device_peak_bytes") for r in ranks),
        "device_baseline_bytes": _max_present(r.get("device_baseline_bytes") for r in ranks),
        # what the model and training added to what the process held before the model
        "device_peak_above_baseline_bytes": _max_present(
            r["device_peak_bytes"] - r["device_baseline_bytes"] for r in ranks
            if r.get("device_peak_bytes") is not None and r.get("device_baseline_bytes") is not None),
        "torch_peak_allocated_bytes": _max_present(r.get("torch_peak_allocated_bytes") for r in ranks),
        "torch_peak_reserved_bytes": _max_present(r.get("torch_peak_reserved_bytes") for r in ranks),
        "symmpool_peak_reserved_bytes": _max_present(s["reserved_bytes"]["peak"] if s else None for s in symm),
        "heap_exchanges_per_step": _max_present(r.get("heap_exchanges_per_step") for r in ranks),
        "symm_collectives": symm[0]["symm_collectives"] if symm[0] else None,
        "nccl_fallbacks": symm[0]["nccl_fallbacks"] if symm[0] else None,
        # a profile may be None (not profiled) or {"error": ...} (the profiler failed)
        "exposed_comm_ms": _max_present((p or {}).get("exposed_comm_ms_per_step") for p in profiles),
        "comm_ms": _max_present((p or {}).get("comm_ms_per_step") for p in profiles),
        "compute_ms": _max_present((p or {}).get("compute_ms_per_step") for p in profiles),
        "gpu_idle_ms": _max_present((p or {}).get("gpu_idle_ms_per_step") for p in profiles),
        # the host's longest CUDA calls on the rank whose GPU idled most
        "host_api_ms": of_the_profile_with_most(profiles, "gpu_idle_ms_per_step", "host_api_ms_per_step"),
        # the rank with the most exposed time: its longest exposed stretches
        "exposed_longest_ms": of_the_most_exposed("exposed_longest_ms"),
        # and why its compute was off the GPU then (results before 2026-11-26's session 24 lack these)
        **{f"exposed_{cause}_ms": of_the_most_exposed(f"exposed_{cause}_ms_per_step") for cause in EXPOSED_CAUSES},
        "exposed_by_collective_ms": of_the_most_exposed("exposed_by_collective_ms_per_step"),
        "profile_errors": [p["error"] for p in profiles if p and "error" in p],
    }


def max_rel_loss_diff(result: dict, reference: dict) -> float:
    """max |a - b| / max(|b|, 1e-12) over ranks and steps both runs have
    (every step, warm-up and profiled ones included: same seed, same data)."""
    if len(result["ranks"]) != len(reference["ranks"]):
        raise ValueError("runs with different world sizes cannot be compared")
    worst = 0.0
    for mine, ref in zip(result["ranks"], reference["ranks"]):
        for a, b in zip(mine["losses"], ref["losses"]):
            if math.isnan(a) or math.isnan(b):
                return math.inf
            worst = max(worst, abs(a - b) / max(abs(b), 1e-12))
    return worst


def _median_or_none(values):
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def aggregate_mode(mode: str, records: list[dict], reference: dict | None) -> dict:
    ok = [r for r in records if r["status"] == "ok"]
    reps = [per_rep(r["result"]) for r in ok]
    steps = [s for rep in reps for s in rep["step_ms"]]
    host = [s for rep in reps for s in rep["host_ms"]]
    step_median = statistics.median(steps) if steps else None
    host_median = statistics.median(host) if host else None
    diagnostics = {f"{key}_median": _median_or_none(v for rep in reps for v in rep[key]) for key in HOST_DIAGNOSTICS}
    entry = {
        "mode": mode,
        "reps": len(ok),
        "steps_per_rep": sorted({len(rep["step_ms"]) for rep in reps}) if reps else [],
        "step_ms_median": step_median,
        "step_ms_p10": percentile(steps, 10) if steps else None,
        "step_ms_p90": percentile(steps, 90) if steps else None,
        "step_ms_rep_medians": [statistics.median(rep["step_ms"]) for rep in reps],
        "host_ms_median": host_median,
        "host_fraction": host_median / step_median if host_median is not None and step_median else None,
        **diagnostics,
        "exposed_comm_ms_median": _median_or_none(rep["exposed_comm_ms"] for rep in reps),
        "comm_ms_median": _median_or_none(rep["comm_ms"] for rep in reps),
        "compute_ms_median": _median_or_none(rep["compute_ms"] for rep in reps),
        "exposed_longest_ms_per_rep": [rep["exposed_longest_ms"] for rep in reps],
        **{f"exposed_{cause}_ms_median": _median_or_none(rep[f"exposed_{cause}_ms"] for rep in reps)
           for cause in EXPOSED_CAUSES},
        "exposed_by_collective_ms_median": {
            kind: _median_or_none((rep["exposed_by_collective_ms"] or {}).get(kind) for rep in reps)
            for kind in sorted({k for rep in reps for k in (rep["exposed_by_collective_ms"] or {})})},
        "gpu_idle_ms_median": _median_or_none(rep["gpu_idle_ms"] for rep in reps),
        "host_api_ms_per_rep": [rep["host_api_ms"] for rep in reps],
        "device_peak_bytes": _max_present(rep["device_peak_bytes"] for rep in reps),
        "device_peak_bytes_per_rep": [rep["device_peak_bytes"] for rep in reps],
        "device_baseline_bytes_per_rep": [rep["device_baseline_bytes"] for rep in reps],
        "device_peak_above_baseline_bytes": _max_present(rep["device_peak_above_baseline_bytes"] for rep in reps),
        "torch_peak_allocated_bytes": _max_present(rep["torch_peak_allocated_bytes"] for rep in reps),
        "torch_peak_reserved_bytes": _max_present(rep["torch_peak_reserved_bytes"] for rep in reps),
        "symmpool_peak_reserved_bytes": _max_present(rep["symmpool_peak_reserved_bytes"] for rep in reps),
        "symm_collectives_per_rep": [rep["symm_collectives"] for rep in reps],
        "heap_exchanges_per_step_per_rep": [rep["heap_exchanges_per_step"] for rep in reps],
        "nccl_fallbacks_per_rep": [rep["nccl_fallbacks"] for rep in reps],
        "max_rel_loss_diff_vs_stock": (max(max_rel_loss_diff(r["result"], reference) for r in ok)
                                       if ok and reference is not None else None),
        "profile_errors": sorted({e for rep in reps for e in rep["profile_errors"]}),
        "failures": [{k: r.get(k) for k in ("rep", "status", "returncode", "reason", "wall_s", "log_tail")}
                     for r in records if r["status"] != "ok"],
    }
    return entry


def _reference_stock(records: list[dict]) -> dict | None:
    """The stock run every mode's losses are compared with: rep 0 if it
    succeeded, else the first stock run that did."""
    stock = sorted((r for r in records if r["mode"] == "stock" and r["status"] == "ok"),
                   key=lambda r: (r["rep"] != 0, r.get("source", ""), r["rep"]))
    return stock[0]["result"] if stock else None


def aggregate(records: list[dict]) -> list[dict]:
    """Records -> the "configs" list: configs in the order first seen, modes in
    MODES order, stock first so ratios have their base."""
    names = list(dict.fromkeys(r["config"] for r in records))
    configs = []
    for name in names:
        mine = [r for r in records if r["config"] == name]
        reference = _reference_stock(mine)
        runs = [aggregate_mode(m, [r for r in mine if r["mode"] == m], reference)
                for m in MODES if any(r["mode"] == m for r in mine)]
        stock = next((run for run in runs if run["mode"] == "stock"), None)
        for run in runs:
            run["step_vs_stock"] = _ratio(run["step_ms_median"], stock and stock["step_ms_median"])
            run["device_peak_vs_stock"] = _ratio(run["device_peak_bytes"], stock and stock["device_peak_bytes"])
        configs.append({"name": name, "model": model_fields(parse_config(name)), "runs": runs})
    return configs


def _ratio(a, b):
    return a / b if a is not None and b else None


def loss_problems(configs: list[dict], rtol: float) -> list[str]:
    return [f"{c['name']} {run['mode']}: losses differ from stock by {run['max_rel_loss_diff_vs_stock']:.3e} "
            f"relative (> {rtol:g})"
            for c in configs for run in c["runs"]
            if run["max_rel_loss_diff_vs_stock"] is not None and run["max_rel_loss_diff_vs_stock"] > rtol]


def failure_lines(configs: list[dict]) -> list[str]:
    return [f"{c['name']} {run['mode']} rep {f['rep']}: {f['status']} (exit {f['returncode']}): {f['reason']}"
            for c in configs for run in c["runs"] for f in run["failures"]]


def profile_error_lines(configs: list[dict]) -> list[str]:
    return [f"{c['name']} {run['mode']}: profiling failed (no exposed communication): {e}"
            for c in configs for run in c["runs"] for e in run.get("profile_errors", [])]


def host_bound_lines(configs: list[dict]) -> list[str]:
    """One line per config where some mode was host-bound: there a step-time
    ratio between modes says how fast the host was, not the collectives."""
    lines = []
    for c in configs:
        bound = [run for run in c["runs"]
                 if run.get("host_fraction") is not None and run["host_fraction"] >= HOST_BOUND_FRACTION]
        if bound:
            shares = ", ".join(f"{run['mode']} {run['host_fraction']:.0%}" for run in bound)
            lines.append(f"{c['name']}: host-bound (host time / step: {shares}; threshold "
                         f"{HOST_BOUND_FRACTION:.0%}): its step-time ratios measure the host, not the collectives")
    return lines


def _fmt(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def table(config: dict) -> str:
    m = config["model"]
    size = f"{m['params'] / 1e9:.2f}B" if m["params"] >= 1e9 else f"{m['params'] / 1e6:.1f}M"
    lines = [f"{config['name']}: {size} params ({m['layers']} x {m['dim']}, MLP {m['mlp']}, "
             f"{m['heads']} heads), batch {m['batch']}, seq {m['seq']}",
             f"{'mode':<12} {'reps':>4} {'step ms median [p10-p90]':>26} {'vs stock':>8} {'host ms':>8} "
             f"{'exp.comm ms':>11} {'gpu idle ms':>11} {'dev peak GiB':>12} {'vs stock':>8} {'loss diff':>9}"]
    for run in config["runs"]:
        step = ("-" if run["step_ms_median"] is None else
                f"{run['step_ms_median']:.1f} [{run['step_ms_p10']:.1f}-{run['step_ms_p90']:.1f}]")
        peak_pct = (None if run["device_peak_vs_stock"] is None else (run["device_peak_vs_stock"] - 1) * 100)
        lines.append(
            f"{run['mode']:<12} {run['reps']:>4} {step:>26} {_fmt(run['step_vs_stock'], '.3f', 'x'):>8} "
            f"{_fmt(run['host_ms_median'], '.1f'):>8} {_fmt(run['exposed_comm_ms_median'], '.2f'):>11} "
            f"{_fmt(run.get('gpu_idle_ms_median'), '.2f'):>11} "
            f"{_fmt(run['device_peak_bytes'] and run['device_peak_bytes'] / GIB, '.2f'):>12} "
            f"{_fmt(peak_pct, '+.2f', '%'):>8} {_fmt(run['max_rel_loss_diff_vs_stock'], '.1e'):>9}")
    causes = [f"{run['mode']} " + "/".join(_fmt(run.get(f"exposed_{c}_ms_median"), ".2f") for c in EXPOSED_CAUSES)
              for run in config["runs"] if run.get("exposed_host_late_ms_median") is not None]
    if causes:
        lines.append("exposed comm ms by cause, each a median of its own (host late / compute waiting on comm / "
                     "unattributed): "
                     + ", ".join(causes))
    kinds = [f"{run['mode']} " + " ".join(f"{kind} {ms:.2f}" for kind, ms in by.items() if ms is not None)
             for run in config["runs"] if (by := run.get("exposed_by_collective_ms_median"))]
    if kinds:
        lines.append("exposed comm ms by the collectives running, each a median of its own: " + ", ".join(kinds))
    return "\n".join(lines)
