"""How long a "symm" group takes to make one of its segments an NCCL
symmetric window (ncclCommWindowRegister, NCCL's barrier with its peers
included), by segment size: the figure the NCCL-window issue bounds (a
1 GiB segment in under 2 ms per rank).

    torchrun --standalone --nproc-per-node=<gpus> bench/window_registration.py --out <json>

Each repetition allocates a fresh tensor of the size (its own segment) and
runs one checked all-reduce on it (SYMMPOOL_COLLECTIVES=nccl-windows): the
heap syncs, the new segment becomes a window, and symmpool's counters give
the time spent in NCCL's registration. JSON with the per-rank times and the
run's provenance (bench/provenance.py: refuses a tree whose tracked files
differ from its commit unless --allow-dirty).
"""

from __future__ import annotations

import argparse
import json
import os

for name, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                    ("NVSHMEM_DISABLE_NVLS", "1")):
    if os.environ.get(name) != value:
        raise SystemExit(f"NVLink multicast must stay off: set {name}={value} (scripts/env.sh)")
os.environ["SYMMPOOL_COLLECTIVES"] = "nccl-windows"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import provenance  # noqa: E402  (bench/, this script's folder)
import symmpool  # noqa: E402

MiB = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", default="2,64,256,1024", help="segment sizes, MiB, comma-separated")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", required=True)
    provenance.add_allow_dirty(parser)
    args = parser.parse_args()
    tree = provenance.require_clean_tree(args.allow_dirty)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group(f"cpu:gloo,cuda:{symmpool.BACKEND_NAME}", device_id=device)
    backend = dist.group.WORLD._get_backend(device)
    keep = [backend.allocate_tensor(1024, dtype=torch.float32, device=device)]
    for _ in range(2):  # the first forms the heap and NCCL's communicator, the second the windows
        dist.all_reduce(keep[0])
    rows = []
    for size in (int(s) * MiB for s in args.sizes_mib.split(",")):
        for rep in range(args.reps):
            before = symmpool.memory_stats(device)
            t = backend.allocate_tensor(size // 4, dtype=torch.float32, device=device)
            dist.all_reduce(t[:1024])  # checked: the heap syncs, the segment becomes a window
            after = symmpool.memory_stats(device)
            made = after["nccl_window_registrations"] - before["nccl_window_registrations"]
            ns = after["nccl_window_register_ns"] - before["nccl_window_register_ns"]
            all_ns = [None] * world
            dist.all_gather_object(all_ns, (made, ns))
            rows.append({"segment_bytes": size, "rep": rep, "windows_made": [m for m, _ in all_ns],
                         "register_ms": [n / 1e6 for _, n in all_ns]})
            keep.append(t)  # a fresh segment each time
    if rank == 0:
        doc = {"context": {"what": "time in ncclCommWindowRegister per new symmetric segment of a symm group "
                                   "(bench/window_registration.py)", "ranks": world, **provenance.collect(state=tree)},
               "results": rows}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        for r in rows:
            print(r["segment_bytes"] // MiB, "MiB", r["windows_made"], ["%.3f" % ms for ms in r["register_ms"]])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
