"""The last step of every bench's plot.py: title the figure and save it as a
PNG next to its JSON (same stem)."""

from __future__ import annotations

import os


def save_figure(fig, json_path: str, title: str) -> str:
    """Titles, lays out, writes and closes `fig`; returns the PNG's path."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    png = os.path.splitext(json_path)[0] + ".png"
    fig.savefig(png, dpi=110)
    plt.close(fig)  # pyplot keeps every open figure: a run plotting many JSONs would pile them up
    return png


def versions(ctx: dict) -> str:
    """The software a run measured, for a figure's title (files before
    bench/provenance.py name the commit in symmpool_commit)."""
    commit = str(ctx.get("commit") or ctx.get("symmpool_commit"))[:12] + (
        " (dirty tree)" if ctx.get("clean_tree") is False else "")
    return f"torch {ctx.get('torch')}, NCCL {ctx.get('nccl')}, symmpool {commit}"
