"""Where a rank's GPU waited: the longest idle gaps of a kept profiler trace
(run.py --keep-traces), each with the GPU work that ended before it and the
work that started after it, and the longest communication items.

    python bench/fsdp2/trace_gaps.py logs/wide4b-b1s512_symm_rep1.rank0.json.gz [--top 15]

Compare two ranks' lists: an idle gap on one rank opposite a long
communication item on the other is a rank waiting for its peer.
"""

from __future__ import annotations

import argparse
import gzip
import json

import comm_profile


def gpu_items(events: list[dict]) -> list[dict]:
    """Kernels, copies and memsets, each with start, end, stream and whether
    it is communication, in start order."""
    items = []
    for e, is_comm in comm_profile.gpu_events(events):
        start, end = comm_profile.interval(e)
        items.append({"start": start, "end": end, "stream": e.get("args", {}).get("stream", e.get("tid")),
                      "name": e["name"], "comm": is_comm})
    return sorted(items, key=lambda i: i["start"])


def idle_gaps(items: list[dict]) -> list[dict]:
    """Stretches inside the first start..last end where nothing runs, with
    the item that ended last before each and the one that starts it."""
    gaps, busy_until, last = [], None, None
    for item in items:
        if busy_until is not None and item["start"] > busy_until:
            gaps.append({"us": item["start"] - busy_until, "at_us": busy_until, "after": last, "before": item})
        if busy_until is None or item["end"] > busy_until:
            busy_until, last = item["end"], item
    return gaps


def describe(item: dict | None) -> str:
    if item is None:
        return "-"
    kind = "comm" if item["comm"] else "compute"
    return f"{kind} on stream {item['stream']}: {item['name'][:70]} ({item['end'] - item['start']:.0f} us)"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="a Chrome trace, .json or .json.gz")
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args(argv)
    opener = gzip.open if args.trace.endswith(".gz") else open
    with opener(args.trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    items = gpu_items(events)
    if not items:
        raise SystemExit(f"{args.trace}: no GPU work in the trace")
    origin = items[0]["start"]
    gaps = sorted(idle_gaps(items), key=lambda g: -g["us"])
    print(f"{len(items)} GPU items over {(max(i['end'] for i in items) - origin) / 1e3:.1f} ms; "
          f"idle {sum(g['us'] for g in gaps) / 1e3:.2f} ms in {len(gaps)} gaps")
    print("longest idle gaps (ms from the first item):")
    for g in gaps[:args.top]:
        print(f"  {g['us'] / 1e3:7.3f} ms at {(g['at_us'] - origin) / 1e3:8.3f}\n"
              f"      after  {describe(g['after'])}\n      before {describe(g['before'])}")
    print("longest communication items:")
    for item in sorted((i for i in items if i["comm"]), key=lambda i: i["start"] - i["end"])[:args.top]:
        print(f"  at {(item['start'] - origin) / 1e3:8.3f} ms: {describe(item)}")


if __name__ == "__main__":
    main()
