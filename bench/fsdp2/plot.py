"""PNG of an FSDP2 benchmark JSON, next to it (same stem): per config, the
median step time per mode with p10-p90 bars, and the device peak memory per
mode.

    python bench/fsdp2/plot.py bench/results/fsdp2_h200x2_2026-11-23.json
"""

from __future__ import annotations

import json
import os
import sys

# figures.py is bench/peers'; appended, not first: bench/peers has a run.py and a plot.py of its own
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "peers"))

from figures import save_figure  # noqa: E402

GIB = 2**30


def plot(json_path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")  # no display on the GPU hosts
    import matplotlib.pyplot as plt

    with open(json_path) as f:
        doc = json.load(f)
    configs = doc["configs"]
    if not configs:
        raise ValueError(f"{json_path} holds no config")
    fig, axes = plt.subplots(len(configs), 2, figsize=(11, 3.2 * len(configs)), squeeze=False)
    for row, config in zip(axes, configs):
        runs = config["runs"]
        modes = [r["mode"] for r in runs]
        x = range(len(runs))
        median = [r["step_ms_median"] or 0.0 for r in runs]
        low = [(r["step_ms_median"] - r["step_ms_p10"]) if r["step_ms_median"] is not None else 0.0 for r in runs]
        high = [(r["step_ms_p90"] - r["step_ms_median"]) if r["step_ms_median"] is not None else 0.0 for r in runs]
        bars = row[0].bar(x, median, yerr=[low, high], capsize=4, color="tab:blue")
        row[0].bar_label(bars, labels=[f"{m:.1f}" if m else "" for m in median], fontsize=7, padding=2)
        row[0].set_ylabel("step ms (median, p10-p90)")
        peak = [(r["device_peak_bytes"] or 0) / GIB for r in runs]
        bars = row[1].bar(x, peak, color="tab:orange")
        row[1].bar_label(bars, labels=[f"{p:.2f}" if p else "" for p in peak], fontsize=7, padding=2)
        row[1].set_ylabel("device peak GiB (axis not from 0)")
        if peak and max(peak) > 0:  # differences of a few percent must be visible
            row[1].set_ylim(min(p for p in peak if p > 0) * 0.97, max(peak) * 1.02)
        for ax in row:
            ax.set_xticks(list(x))
            ax.set_xticklabels(modes, rotation=20, fontsize=8)
            ax.set_title(config["name"], fontsize=10)
            ax.grid(axis="y", alpha=0.3)
        for i, r in enumerate(runs):
            if not r["reps"]:
                row[0].annotate("failed", (i, 0), ha="center", va="bottom", color="red", fontsize=8)
    ctx = doc.get("context", {})
    # "gpu" is the machine's GPU model (in older files a short name, the model in gpu_name)
    where = "cpu" if ctx.get("device") == "cpu" else ctx.get("gpu_name") or ctx.get("gpu")
    return save_figure(fig, json_path, f"FSDP2 on {ctx.get('ranks')} x {where}, "
                       f"torch {ctx.get('torch')}, NCCL {ctx.get('nccl')}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(plot(sys.argv[1]))
