"""What rank 0 of bench/peers and bench/tp_ops writes: the JSON, whole, after
every step (a killed job keeps what it had), and at the end of the run the
table, the problems and the PNG."""

from __future__ import annotations

import json
import os
import sys


def write_json(path: str, doc: dict) -> None:
    """Whole or not at all: a reader never sees half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def finish_run(out: str, doc: dict, table: str, problems: list[str], plot: bool) -> None:
    """The final JSON, the table and the problems on stdout, then the PNG.
    plot.py is imported by bare name: each bench puts its own directory
    first on sys.path, so its own plot.py draws."""
    write_json(out, doc)
    print(table)
    print("\n".join(["problems:", *problems] if problems else ["no problems"]))
    print(f"wrote {out}")
    if plot:
        try:
            import plot as plot_module

            print(f"wrote {plot_module.plot(out)}")
        except Exception as e:  # noqa: BLE001  (the JSON is what counts)
            print(f"no plot: {type(e).__name__}: {e}", file=sys.stderr)
