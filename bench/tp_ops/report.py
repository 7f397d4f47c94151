"""The TP benchmark's JSON cells, the ratios between the peers of a shape,
the problems that fail the run and the table printed at the end. Pure: no
torch (bench/peers' timing.py is numpy only)."""

from __future__ import annotations

import timing  # bench/peers

TARGET_RATIO = 1.03  # issue 16: fused <= 1.03 x matmul-alone where the matmul is longer than the transfer
FUSED = ("symmpool-fused", "torch-fused")


def cell(key: tuple, shape, peer: str, status: str, reason: str | None = None, per_rank: list | None = None,
         correct: bool | None = None, **extra) -> dict:
    """One cell of the JSON. `key`: (op, model, M); `shape`: its
    shapes.Shape, None where the ranks cannot split it; `per_rank`: each
    rank's per-call microseconds of every round (None when not timed)."""
    op, model, m = key
    stats = dict.fromkeys(("median_us", "p10_us", "p90_us"))
    if per_rank:
        s = timing.summarize(per_rank)
        stats = {"median_us": s["time_us_median"], "p10_us": s["time_us_p10"], "p90_us": s["time_us_p90"]}
    median = stats["median_us"]
    tflops = shape.flops / median / 1e6 if median and peer != "transfer-alone" else None
    busbw = None
    if median and peer == "transfer-alone":
        collective = "all_gather" if op == "all_gather_matmul" else "reduce_scatter"
        busbw = timing.bandwidth(collective, shape.transfer_bytes, median, shape.world)[1]
    return {"op": op, "model": model, "m": m, "shape": shape.describe() if shape else None, "peer": peer,
            "status": status, "reason": reason, "correct": correct, **stats, "ratio_to_matmul_alone": None,
            "speedup_vs_nccl_unfused": None, "tflops": tflops, "busbw_gbps": busbw, "per_rank_us": per_rank,
            **extra}


def same_shape(a: dict, b: dict) -> bool:
    return (a["op"], a["model"], a["m"]) == (b["op"], b["model"], b["m"])


def add_ratios(cells: list[dict]) -> None:
    """Fills, for the cells of each shape: ratio_to_matmul_alone and
    speedup_vs_nccl_unfused (median over median), whether the matmul alone
    is longer than the transfer alone, and, on the fused peers' cells,
    whether they meet the target (None where the transfer is the longer or
    a time is missing)."""
    for c in cells:
        peers = {o["peer"]: o["median_us"] for o in cells if same_shape(o, c) and o["median_us"]}
        mm, nccl, transfer = (peers.get(p) for p in ("matmul-alone", "nccl-unfused", "transfer-alone"))
        median = c["median_us"]
        c["ratio_to_matmul_alone"] = median / mm if median and mm else None
        c["speedup_vs_nccl_unfused"] = nccl / median if median and nccl else None
        c["matmul_longer_than_transfer"] = mm > transfer if mm and transfer else None
        if c["peer"] in FUSED:
            ratio = c["ratio_to_matmul_alone"]
            c["meets_target"] = ratio <= TARGET_RATIO if ratio and c["matmul_longer_than_transfer"] else None


def problems(cells: list[dict]) -> list[str]:
    """Cells whose result differs from NCCL's, and symmpool transfers that
    did not run on symmpool (then they time NCCL under symmpool's name).
    Unavailable, skipped and unrun cells are not problems."""
    out = []
    for c in cells:
        where = f"{c['op']} {c['model']} M={c['m']} {c['peer']}"
        if c["correct"] is False:
            out.append(f"{where}: result differs from nccl-unfused's")
        if c["peer"] == "transfer-alone" and c.get("calls_issued") is not None and \
                c["symm_collectives"] != c["calls_issued"]:
            out.append(f"{where}: {c['symm_collectives']} of {c['calls_issued']} calls ran on symmpool")
    return out


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(cells: list[dict]) -> str:
    """One line per cell: what a log reader needs at a glance."""
    lines = [f"{'op':<22} {'model':<5} {'M':>6} {'peer':<15} {'us':>10} {'host us':>8} {'x mm':>6} {'x nccl':>6}  "
             "status"]
    for c in cells:
        status = c["status"] + (f": {c['reason']}" if c["reason"] and c["status"] != "wrong" else "")
        lines.append(f"{c['op']:<22} {c['model']:<5} {c['m']:>6} {c['peer']:<15} {_fmt(c['median_us'], '.1f'):>10} "
                     f"{_fmt(c.get('host_us_median'), '.1f'):>8} "
                     f"{_fmt(c['ratio_to_matmul_alone'], '.3f'):>6} {_fmt(c['speedup_vs_nccl_unfused'], '.2f'):>6}  "
                     f"{status[:160]}")
    return "\n".join(lines)
