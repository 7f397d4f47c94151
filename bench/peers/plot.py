"""PNG of a peer benchmark JSON, next to it (same stem): per op, busbw
against size (all sizes) and per-call latency against size (small sizes),
one line per peer and mode (eager solid, graph dashed), the bare peer copy
as the reference on every panel and the NVLink limit on the busbw ones.

    python bench/peers/plot.py bench/results/peers_h200x2_<date>.json [more.json ...]
"""

from __future__ import annotations

import json
import sys

from figures import save_figure, versions

LATENCY_MAX_BYTES = 1 << 20  # the latency panels: where per-call overheads dominate
OPS = ("all_gather", "reduce_scatter", "all_reduce")


def label(row: dict) -> str:
    return row["peer"] + (f" {row['variant']}" if row["variant"] else "")


def series(rows: list[dict]) -> dict:
    """(label, mode) -> the rows that ran, by size; a label gains "(WRONG)"
    when any of its sizes gave a wrong result."""
    lines = {}
    for r in rows:
        if r["time_us_median"] is not None:
            lines.setdefault((label(r), r["mode"]), []).append(r)
    out = {}
    for (name, mode), rs in lines.items():
        wrong = any(r["correct"] is False for r in rs)
        out[(name + (" (WRONG)" if wrong else ""), mode)] = sorted(rs, key=lambda r: r["bytes"])
    return out


def size_label(nbytes: float, _pos=None) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes / div:g}{unit}"
    return f"{nbytes:g}"


def plot(json_path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")  # no display on the GPU hosts
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    with open(json_path) as f:
        doc = json.load(f)
    rows, ctx = doc["results"], doc.get("context", {})
    ops = [op for op in OPS if any(r["op"] == op for r in rows)]
    if not ops:
        raise ValueError(f"{json_path} holds no all-gather, reduce-scatter or all-reduce result")
    reference = series([r for r in rows if r["op"] == "peer_copy"])
    names = sorted({name for op in ops for name, _ in series([r for r in rows if r["op"] == op])})
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(names)}
    # The peer copy's variants in black, told apart by line style.
    reference_styles = {name: ("-", "-.", ":", (0, (5, 1)))[i % 4]
                        for i, name in enumerate(sorted({name for name, _ in reference}))}
    fig, axes = plt.subplots(len(ops), 2, figsize=(13, 3.8 * len(ops)), squeeze=False)
    for (bw_ax, lat_ax), op in zip(axes, ops):
        lines = series([r for r in rows if r["op"] == op])
        for lines_of, is_reference in ((lines, False), (reference, True)):
            for (name, mode), rs in sorted(lines_of.items()):
                if is_reference:
                    style = dict(color="black" if mode == "eager" else "dimgray", linewidth=2.2,
                                 linestyle=reference_styles[name])
                else:
                    style = dict(color=colors[name], linewidth=1.4, linestyle="-" if mode == "eager" else "--")
                style.update(marker="." if mode == "eager" else "x", label=f"{name} ({mode})")
                bw_ax.plot([r["bytes"] for r in rs], [r["busbw_gbps"] for r in rs], **style)
                small = [r for r in rs if r["bytes"] <= LATENCY_MAX_BYTES]
                if small:
                    lat_ax.plot([r["bytes"] for r in small], [r["time_us_median"] for r in small], **style)
        if not lat_ax.lines:
            lat_ax.text(0.5, 0.5, f"no size <= {size_label(LATENCY_MAX_BYTES)} in this run", ha="center",
                        va="center", transform=lat_ax.transAxes)
        limit = ctx.get("nvlink_gbps_per_direction")
        if limit:
            bw_ax.axhline(limit, color="grey", linestyle=":", label=f"NVLink {limit} GB/s per direction")
        bw_ax.set_ylabel("busbw GB/s (median)")
        lat_ax.set_ylabel("us per call (median)")
        for ax, what in ((bw_ax, "busbw"), (lat_ax, f"latency, sizes <= {size_label(LATENCY_MAX_BYTES)}")):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(size_label))
            ax.set_xlabel("bytes (all-gather output, reduce-scatter input, all-reduce buffer)", fontsize=8)
            ax.set_title(f"{op}: {what}", fontsize=10)
            ax.grid(alpha=0.3)
        bw_ax.legend(fontsize=6, loc="upper left")
    return save_figure(fig, json_path, f"bf16 collectives on {ctx.get('ranks')} x {ctx.get('gpu')}, {versions(ctx)}")


if __name__ == "__main__":
    for path in sys.argv[1:] or sys.exit(__doc__):
        print(plot(path))
