"""One process's allocator against a fragmenting workload: a Llama-style
model (bench/fsdp2's "1b" preset: 16 layers of 2048, MLP 5632, 0.95B
parameters), bf16, fused AdamW, one GPU, the sequence length changing every
step between 512 and 4096 at a fixed 16k tokens (the same schedule in every
mode). Run each mode in its own process, repeated and interleaved:

    python bench/allocator_workload.py --mode torch --out run.json
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \\
        python bench/allocator_workload.py --mode torch-expandable --out run.json
    python bench/allocator_workload.py --mode symmpool --out run.json

then merge the runs with --merge (JSON and PNG). With `--mode torch
--record-trace TRACE.gz` the run also records every allocation and free
(torch's memory history) in the text format of bench/allocator_replay.cpp,
which replays it through symmpool's allocator on the fake driver, so that
allocator policies can be compared without a GPU. The device's peak is
sampled by a thread reading cudaMemGetInfo every millisecond (what the
device sees, the CUDA context and other processes' memory included: the
baseline before the model is built is subtracted), beside the allocator's
own peak reserved and allocated bytes.
"""

from __future__ import annotations

import os

os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
                  SYMMPOOL_DISABLE_MULTICAST="1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fsdp2"))

MODES = ("torch", "torch-expandable", "symmpool")
TOKENS = 16384
SEQS = (512, 1024, 2048, 4096, 768, 3072, 1536, 2560)  # the schedule, repeated


class DevicePeak:
    """The most device memory in use, sampled every millisecond."""

    def __init__(self, torch) -> None:
        self.torch, self.peak, self._stop = torch, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            free, total = self.torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)
            time.sleep(0.001)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run(args) -> dict:
    expandable = "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if (args.mode == "torch-expandable") != expandable:
        raise SystemExit(f"--mode {args.mode} needs PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                         "exactly when the mode is torch-expandable")
    import torch

    import provenance
    tree = provenance.require_clean_tree(args.allow_dirty)
    if args.mode == "symmpool":
        import symmpool
        symmpool.install()
    from configs import PRESETS
    from llama import Llama

    torch.cuda.init()
    if args.record_trace:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=TRACE_ENTRIES)
    free, total = torch.cuda.mem_get_info()
    baseline = total - free
    spec = PRESETS["1b"]
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Llama(spec, max_seq=max(SEQS))
    model.to_empty(device="cuda")
    model.init_weights(seed=0)
    model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    times, losses = [], []
    with DevicePeak(torch) as peak:
        for step in range(args.warmup + args.steps):
            seq = SEQS[step % len(SEQS)]
            tokens = torch.randint(0, spec.vocab, (TOKENS // seq, seq + 1), device="cuda", generator=gen)
            torch.cuda.synchronize()
            began = time.perf_counter()
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            if step >= args.warmup:
                times.append((time.perf_counter() - began) * 1e3)
                losses.append(loss.item())
    stats = torch.cuda.memory_stats()
    if args.record_trace:
        write_trace(torch.cuda.memory._snapshot(), args.record_trace)
    return {
        "context": {**provenance.collect(state=tree),
                    "mode": args.mode, "model": "1b (16 x 2048, MLP 5632)", "tokens_per_step": TOKENS,
                    "seqs": list(SEQS), "warmup": args.warmup, "steps": args.steps,
                    "allocator": torch.cuda.get_allocator_backend() if args.mode != "symmpool" else "symmpool"},
        "step_ms": times,
        "step_ms_median": statistics.median(times),
        "device_peak_bytes": peak.peak - baseline,
        "max_reserved_bytes": stats["reserved_bytes.all.peak"],
        "max_allocated_bytes": stats["allocated_bytes.all.peak"],
        "losses": losses,
    }


TRACE_ENTRIES = 8_000_000
TRACE_KINDS = {"alloc": "a", "free_requested": "f", "segment_alloc": "s", "segment_free": "S",
               "segment_map": "s", "segment_unmap": "S"}


def trace_lines(entries: list[dict]) -> list[str]:
    """torch's memory-history entries of one device as allocator_replay reads
    them: "a <id> <bytes> <stream>", "f <id>", "s <bytes>", "S <bytes>"."""
    lines = []
    for e in entries:
        kind = TRACE_KINDS.get(e["action"])
        if kind == "a":
            lines.append(f"a {e['addr']} {e['size']} {e['stream']}")
        elif kind == "f":
            lines.append(f"f {e['addr']}")
        elif kind is not None:
            lines.append(f"{kind} {e['size']}")
    return lines


def write_trace(snapshot: dict, path: str) -> None:
    import gzip
    entries = snapshot["device_traces"][0]
    if len(entries) >= TRACE_ENTRIES:
        raise SystemExit(f"--record-trace: torch's history kept only its last {TRACE_ENTRIES} entries")
    lines = trace_lines(entries)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        f.write("# allocations and frees of bench/allocator_workload.py --mode torch, from torch's memory history\n")
        f.write("\n".join(lines) + "\n")
    print(f"trace: {len(lines)} events in {path}")


def merge(paths: list[str], out: str) -> None:
    """One JSON (every run, and per mode the medians' median and range) and a PNG."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    modes = {}
    for r in runs:
        m = modes.setdefault(r["context"]["mode"], {"step_ms_medians": [], "device_peak_gib": [],
                                                     "max_reserved_gib": []})
        m["step_ms_medians"].append(r["step_ms_median"])
        m["device_peak_gib"].append(r["device_peak_bytes"] / 2**30)
        m["max_reserved_gib"].append(r["max_reserved_bytes"] / 2**30)
    for m in modes.values():
        for key in list(m):
            m[key + "_median"] = statistics.median(m[key])
    with open(out, "w") as f:
        json.dump({"context": {k: v for k, v in runs[0]["context"].items() if k != "mode"},
                   "modes": modes, "runs": runs}, f, indent=1)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(modes)
    for i, name in enumerate(names):
        a.scatter([i] * len(modes[name]["device_peak_gib"]), modes[name]["device_peak_gib"])
        b.scatter([i] * len(modes[name]["step_ms_medians"]), modes[name]["step_ms_medians"])
    for ax, title in ((a, "device peak (GiB, above the idle context)"), (b, "step, median (ms)")):
        ax.set_xticks(range(len(names)), names)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    fig.suptitle("0.95B Llama, bf16, AdamW, 16k tokens a step, seq 512-4096 (one H200, each run its own process)")
    fig.tight_layout()
    fig.savefig(os.path.splitext(out)[0] + ".png", dpi=110)
    for name in names:
        m = modes[name]
        print(f"{name:<17} step {m['step_ms_medians_median']:7.1f} ms ({min(m['step_ms_medians']):.1f}-"
              f"{max(m['step_ms_medians']):.1f})  device peak {m['device_peak_gib_median']:6.2f} GiB "
              f"({min(m['device_peak_gib']):.2f}-{max(m['device_peak_gib']):.2f})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--out", required=True)
    p.add_argument("--merge", nargs="+", help="runs' JSON files to merge into --out (and its PNG)")
    p.add_argument("--record-trace", metavar="TRACE",
                   help="with --mode torch: every allocation and free, for bench/allocator_replay.cpp (.gz: gzipped)")
    import provenance
    provenance.add_allow_dirty(p)
    args = p.parse_args()
    if args.merge:
        merge(args.merge, args.out)
        return 0
    if not args.mode:
        p.error("--mode is needed unless --merge")
    if args.record_trace and args.mode != "torch":
        p.error("--record-trace records torch's own allocator: --mode torch")
    result = run(args)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{args.mode}: step {result['step_ms_median']:.1f} ms, device peak "
          f"{result['device_peak_bytes'] / 2**30:.2f} GiB, max reserved {result['max_reserved_bytes'] / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
