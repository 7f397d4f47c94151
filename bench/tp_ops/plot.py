"""PNG of a TP benchmark JSON, next to it (same stem): one row per op; on
the left each peer's time per shape normalized to matmul-alone (bars, p10 to
p90 whiskers, the target of the context as a line), on the right the median times
themselves (log scale).

    python bench/tp_ops/plot.py bench/results/tp_ops_h200x2_<date>.json [more.json ...]
"""

from __future__ import annotations

import json
import os
import sys

# figures.py is bench/peers'; appended, not first: bench/peers has a run.py and a plot.py of its own
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "peers"))

from figures import save_figure, versions  # noqa: E402

OPS = ("all_gather_matmul", "matmul_reduce_scatter")
PEER_ORDER = ("matmul-alone", "transfer-alone", "nccl-unfused", "torch-fused", "symmpool-fused")


def shapes_of(cells: list[dict]) -> list[tuple]:
    """(model, M) in the order the JSON has them."""
    return list(dict.fromkeys((c["model"], c["m"]) for c in cells))


def bars(cells: list[dict], peer: str, shapes: list[tuple]) -> tuple[list, list, list, list]:
    """Per shape: the peer's (median, p10, p90) over matmul-alone's median,
    its median in ms (None where either did not run), and its label there
    ("WRONG", "n/a")."""
    by_shape = {(c["model"], c["m"]): c for c in cells if c["peer"] == peer}
    mm = {(c["model"], c["m"]): c["median_us"] for c in cells if c["peer"] == "matmul-alone"}
    norm, spread, ms, notes = [], [], [], []
    for s in shapes:
        c = by_shape.get(s)
        ran = c is not None and c["median_us"] is not None
        base = mm.get(s)
        norm.append(c["median_us"] / base if ran and base else None)
        spread.append((c["p10_us"] / base, c["p90_us"] / base) if ran and base else None)
        ms.append(c["median_us"] / 1e3 if ran else None)
        notes.append("WRONG" if c is not None and c["correct"] is False else ("" if ran else "n/a"))
    return norm, spread, ms, notes


def plot(json_path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")  # no display on the GPU hosts
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    with open(json_path) as f:
        doc = json.load(f)
    cells, ctx = doc["cells"], doc.get("context", {})
    ops = [op for op in OPS if any(c["op"] == op and c["median_us"] is not None for c in cells)]
    if not ops:
        raise ValueError(f"{json_path} holds no timed cell")
    fig, axes = plt.subplots(len(ops), 2, figsize=(14, 4.2 * len(ops)), squeeze=False)
    for (norm_ax, abs_ax), op in zip(axes, ops):
        rows = [c for c in cells if c["op"] == op]
        shapes = shapes_of(rows)
        peers = [p for p in PEER_ORDER if any(c["peer"] == p for c in rows)]
        peers += sorted({c["peer"] for c in rows} - set(peers))
        width = 0.8 / len(peers)
        legend = []
        for i, peer in enumerate(peers):
            norm, spread, ms, notes = bars(rows, peer, shapes)
            xs = [j + (i - (len(peers) - 1) / 2) * width for j in range(len(shapes))]
            color = plt.cm.tab10(i % 10)
            for x, v, sp, t, note in zip(xs, norm, spread, ms, notes):
                if v is not None:
                    norm_ax.bar(x, v, width, color=color, hatch="//" if note else None)
                    norm_ax.plot([x, x], sp, color="black", linewidth=0.8)
                if t is not None:
                    abs_ax.bar(x, t, width, color=color, hatch="//" if note else None)
                if note:
                    norm_ax.text(x, (v or 0) + 0.02, note, rotation=90, fontsize=6, ha="center", va="bottom")
            legend.append(Patch(color=color, label=peer))  # (an empty bar() would show the default colour)
        norm_ax.axhline(1.0, color="grey", linewidth=0.8)
        if ctx.get("target_ratio"):
            legend.append(norm_ax.axhline(ctx["target_ratio"], color="red", linestyle=":",
                                          label=f"target: fused <= {ctx['target_ratio']:g} x matmul-alone"))
        labels = [f"{model}\nM={m}" for model, m in shapes]
        for ax in (norm_ax, abs_ax):
            ax.set_xticks(range(len(shapes)), labels, fontsize=8)
            ax.grid(alpha=0.3, axis="y")
        norm_ax.set_ylabel("median time / matmul-alone's")
        norm_ax.set_title(f"{op}: time over matmul-alone (whiskers p10-p90)", fontsize=10)
        abs_ax.set_yscale("log")
        abs_ax.set_ylabel("ms per call (median)")
        abs_ax.set_title(f"{op}: time per call", fontsize=10)
        norm_ax.set_ylim(0, norm_ax.get_ylim()[1] * 1.35)  # headroom: the legend goes above the bars
        norm_ax.legend(handles=legend, fontsize=7, loc="upper left", ncol=3)
    dims = f"gather_dim {ctx.get('gather_dim', 0)}, scatter_dim {ctx.get('scatter_dim', 0)}"
    return save_figure(fig, json_path, f"bf16 TP ops on {ctx.get('ranks')} x {ctx.get('gpu')} ({dims}), "
                       f"{versions(ctx)}")


if __name__ == "__main__":
    for path in sys.argv[1:] or sys.exit(__doc__):
        print(plot(path))
