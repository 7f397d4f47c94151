"""What splitting a tensor-parallel matmul into per-rank row chunks costs on
one GPU, with no communication: the floor under a fused op's time (issue
16's target is <= 1.03x the matmul alone).

    python3 bench/tp_ops/split_cost.py [--world 2] [--out FILE]

For each Llama-3 layer that the TP benchmark times (shapes.py: column-parallel
A [M, hidden] @ B [hidden, mlp/W], row-parallel A [M, mlp/W] @ B [mlp/W,
hidden]), bf16, it times:
  full            one matmul
  chunks          the W row chunks' matmuls one after another (what
                  symmpool's fused ops run on the caller's stream)
  chunks-2streams chunks alternating over two streams (torch's pipelined
                  ops run a peer's chunk on a second stream)
  stage+chunks    an SM copy of one chunk first (the fused all-gather stages
                  its shard in the workspace), then the chunks
  copy-beside     the chunks, with a copy of one chunk on a second stream
                  beside the last one (the fused all-gather places its own
                  shard there)
  copy            the copy of one chunk alone
  chunks+sum      row-parallel layers only: the chunks, then the sum over
                  the W chunk products that the reduce-scatter ends with
                  (each rank's chunk d lands in slot d of rank d, which sums
                  its W slots), as at::sum over the [W, rows, cols] stack:
                  matmul_reduce_scatter's floor with no transfer before
                  5608019, and at more than 2 ranks
  sum             that sum alone
  chunks+add, add at 2 ranks, the same with one elementwise add of the two
                  slots, as the fused op combines them since 5608019
Per mode: median, p10 and p90 of --reps rounds of --iters calls between CUDA
events; the modes' order rotates every round. JSON to --out (default
bench/results/tp_ops_split_cost_<gpu>x1_<date>.json). Refuses a tree whose
tracked files differ from its commit unless --allow-dirty (bench/provenance.py).
"""

from __future__ import annotations

import os

# NVLink multicast stays off on the lent machines (nothing here communicates;
# set all the same, before torch reads it, as every GPU script here does).
os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.dirname(HERE))
import provenance  # noqa: E402  (bench/)
import shapes  # noqa: E402


def quantiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]  # noqa: E731
    return {"median_us": round(statistics.median(xs), 1), "p10_us": round(pick(0.1), 1),
            "p90_us": round(pick(0.9), 1)}


def modes(A, B, C, world: int, side: torch.cuda.Stream, reduces: bool) -> dict:
    rows = A.shape[0] // world
    chunk = lambda r: (A[r * rows:(r + 1) * rows], C[r * rows:(r + 1) * rows])  # noqa: E731
    stage = torch.empty_like(chunk(0)[0])
    slots = C[:world * rows].view(world, rows, C.shape[1])  # chunk r's product, as the reduce-scatter's slot r
    reduced = torch.empty_like(slots[0])
    main = torch.cuda.current_stream()

    def full():
        torch.mm(A, B, out=C)

    def chunks():
        for r in range(world):
            a, c = chunk(r)
            torch.mm(a, B, out=c)

    def chunks_2streams():
        side.wait_stream(main)
        for r in range(world):
            a, c = chunk(r)
            with torch.cuda.stream(side if r % 2 else main):
                torch.mm(a, B, out=c)
        main.wait_stream(side)

    def stage_chunks():
        stage.copy_(chunk(0)[0])
        chunks()

    def copy_beside():
        for r in range(world - 1):
            a, c = chunk(r)
            torch.mm(a, B, out=c)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            stage.copy_(chunk(0)[0])
        a, c = chunk(world - 1)
        torch.mm(a, B, out=c)
        main.wait_stream(side)

    def copy():
        stage.copy_(chunk(0)[0])

    def reduce():
        torch.sum(slots, 0, out=reduced)

    def chunks_sum():
        chunks()
        reduce()

    def add():
        torch.add(slots[0], slots[1], out=reduced)

    def chunks_add():
        chunks()
        add()

    timed = {"full": full, "chunks": chunks, "chunks-2streams": chunks_2streams, "stage+chunks": stage_chunks,
             "copy-beside": copy_beside, "copy": copy}
    if reduces:
        timed.update({"chunks+sum": chunks_sum, "sum": reduce})
    if reduces and world == 2:
        timed.update({"chunks+add": chunks_add, "add": add})
    return timed


def time_modes(fns: dict, iters: int, reps: int, warmup: int) -> dict:
    names = list(fns)
    for f in fns.values():
        for _ in range(warmup):
            f()
    times = {n: [] for n in names}
    for rep in range(reps):
        for n in names[rep % len(names):] + names[:rep % len(names)]:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fns[n]()
            stop.record()
            stop.synchronize()
            times[n].append(start.elapsed_time(stop) * 1000 / iters)
    return {n: quantiles(t) for n, t in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2, help="ranks the layer is split over (chunks)")
    p.add_argument("--m", default="2048,8192,32768", help="tokens (batch x seq), comma-separated")
    p.add_argument("--models", default="8b,70b")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out")
    provenance.add_allow_dirty(p)
    args = p.parse_args(argv)
    tree = provenance.require_clean_tree(args.allow_dirty)
    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name(device)
    side = torch.cuda.Stream()
    rows = []
    for model in args.models.split(","):
        dims = shapes.MODELS[model]
        for m in (int(x) for x in args.m.split(",")):
            for layer, k, n in (("column-parallel (all_gather_matmul)", dims.hidden, dims.mlp // args.world),
                                ("row-parallel (matmul_reduce_scatter)", dims.mlp // args.world, dims.hidden)):
                A = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                B = torch.randn(k, n, device=device, dtype=torch.bfloat16)
                C = torch.empty(m, n, device=device, dtype=torch.bfloat16)
                timed = time_modes(modes(A, B, C, args.world, side, reduces=layer.startswith("row")),
                                   args.iters, args.reps, args.warmup)
                full = timed["full"]["median_us"]
                row = {"model": model, "m": m, "layer": layer, "k": k, "n": n, "modes": timed,
                       "ratio_to_full": {name: round(t["median_us"] / full, 3) for name, t in timed.items()}}
                print(json.dumps({key: row[key] for key in ("model", "m", "layer", "ratio_to_full")}), flush=True)
                rows.append(row)
                del A, B, C
    date = datetime.date.today().isoformat()
    tag = "h200" if "H200" in gpu else "h100" if "H100" in gpu else gpu.replace(" ", "_").lower()
    out = args.out or os.path.join(HERE, "..", "results", f"tp_ops_split_cost_{tag}x1_{date}.json")
    context = {"what": "matmuls of a TP layer split into per-rank row chunks, on one GPU, no communication "
                       "(bench/tp_ops/split_cost.py)",
               **provenance.collect(state=tree), "gpu": gpu, "world": args.world, "dtype": "bfloat16",
               "iters": args.iters, "reps": args.reps, "warmup": args.warmup,
               "bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
               "time": "per call, us: median, p10, p90 over --reps rounds of --iters calls between CUDA events; "
                       "modes in an order that rotates every round"}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"context": context, "rows": rows}, f, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
