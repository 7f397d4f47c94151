"""Where a rank's GPU waited: the longest idle gaps of a kept profiler trace
(run.py --keep-traces), each with the GPU work that ended before it and the
work that started after it, and the longest communication items.

    python bench/fsdp2/trace_gaps.py logs/wide4b-b1s512_symm_rep1.rank0.json.gz [--top 15]
    python bench/fsdp2/trace_gaps.py <rank0 trace> --peer <rank1 trace>

With --peer, the two ranks' communication items are paired in order (the
ranks run the same collectives) and the pairs whose starts differ most are
listed: the rank that started later kept its peer waiting. Both traces'
times count from their first communication item (the ranks' clocks are the
same host's, but the traces start apart).
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
        items.append({"start": start, "end": end, "stream": comm_profile.stream_of(e),
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


def paired_comm(items: list[dict], peer_items: list[dict]) -> list[dict]:
    """The ranks' communication items paired in order, with each start
    relative to that rank's first communication item (us) and the lag of
    the peer's start behind ours (negative: the peer started first)."""
    mine = [i for i in items if i["comm"]]
    theirs = [i for i in peer_items if i["comm"]]
    if not mine or not theirs:
        return []
    origin, peer_origin = mine[0]["start"], theirs[0]["start"]
    return [{"index": n, "mine": a, "theirs": b, "at_us": a["start"] - origin,
             "lag_us": (b["start"] - peer_origin) - (a["start"] - origin)}
            for n, (a, b) in enumerate(zip(mine, theirs))]


def describe(item: dict | None) -> str:
    if item is None:
        return "-"
    kind = "comm" if item["comm"] else "compute"
    return f"{kind} on stream {item['stream']}: {item['name'][:70]} ({item['end'] - item['start']:.0f} us)"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="a Chrome trace, .json or .json.gz")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--peer", help="another rank's trace of the same steps: pair the communication items")
    args = p.parse_args(argv)
    items = gpu_items(load(args.trace))
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
    if args.peer:
        peer_items = gpu_items(load(args.peer))
        pairs = paired_comm(items, peer_items)
        counts = (sum(i["comm"] for i in items), sum(i["comm"] for i in peer_items))
        print(f"communication items: {counts[0]} here, {counts[1]} on the peer"
              + ("" if counts[0] == counts[1] else " (unequal: pairs past the first difference mislead)"))
        print("pairs whose starts differ most (lag: the peer's start behind ours, ms):")
        for pair in sorted(pairs, key=lambda q: -abs(q["lag_us"]))[:args.top]:
            print(f"  #{pair['index']} at {pair['at_us'] / 1e3:8.3f} ms, lag {pair['lag_us'] / 1e3:+8.3f}: "
                  f"here {describe(pair['mine'])}\n      peer {describe(pair['theirs'])}")


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


if __name__ == "__main__":
    main()
