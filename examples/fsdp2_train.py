"""Example (and the loss-parity test's body): train a small transformer with
FSDP2 twice in one process, on stock NCCL and on the "symm" backend with
FSDP2's comm buffers allocated from symmpool
(``set_allocate_memory_from_process_group_for_comm(True)``), and compare.
The main job (scripts/train.sh) and the benchmark (bench/fsdp2/run.py) run
each mode in its own process instead, for step time and memory.

    torchrun --nproc-per-node=<gpus> examples/fsdp2_train.py --steps 50

Prints step time, peak memory, the losses of both runs (they must agree) and
symmpool statistics; exits 1 if the losses differ beyond --rtol.
``--replicate R`` trains HSDP on a 2-D mesh (R replicas of world/R shards),
every dimension on "nccl" or on "symm".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

import symmpool


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def make_mesh(backend: str, symm_world: dist.ProcessGroup | None, replicate: int) -> DeviceMesh:
    """1-D over the world (the default group for "nccl", `symm_world` for
    "symm"), or 2-D (replicate, shard) for HSDP with every dimension's groups
    on `backend`."""
    if replicate == 1:
        return DeviceMesh.from_group(symm_world if backend == "symm" else dist.group.WORLD, "cuda")
    world = dist.get_world_size()
    if world % replicate:
        raise SystemExit(f"--replicate {replicate} does not divide the world size {world}")
    override = {"replicate": backend, "shard": backend} if backend == "symm" else None
    return init_device_mesh("cuda", (replicate, world // replicate), mesh_dim_names=("replicate", "shard"),
                            backend_override=override)


def train(mesh: DeviceMesh, use_symm: bool, args) -> dict:
    """Trains from the same initial weights and data every time it is called."""
    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(args.seed)
    model = TinyTransformer(args.vocab, args.dim, args.layers, args.heads, args.seq).to(device)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if use_symm:
        symmpool.allocate_fsdp_comm_buffers_from_symm(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = torch.Generator(device="cpu").manual_seed(args.seed * 1000 + dist.get_rank())

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    losses, step_ms = [], []
    for _ in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=data).to(device)
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - start) * 1e3)
        losses.append(loss.item())
    warm = step_ms[min(3, len(step_ms) - 1):]
    return {
        "losses": losses,
        "step_ms_median": statistics.median(warm),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rtol", type=float, default=1e-4, help="largest relative loss difference allowed")
    p.add_argument("--json", help="write the results of rank 0 here")
    p.add_argument("--replicate", type=int, default=1,
                   help="HSDP on a (replicate, world/replicate) mesh; 1: FSDP over all ranks")
    return p.parse_args(argv)


def compare(nccl: dict, symm: dict) -> float:
    return max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(nccl["losses"], symm["losses"]))


def main(argv=None) -> int:
    args = parse_args(argv)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device)
    symm_world = dist.new_group(backend=symmpool.BACKEND_NAME) if args.replicate == 1 else None
    try:
        nccl = train(make_mesh("nccl", None, args.replicate), False, args)
        symm = train(make_mesh(symmpool.BACKEND_NAME, symm_world, args.replicate), True, args)
        stats = symmpool.memory_stats()
        worst = torch.tensor([compare(nccl, symm)], device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        worst = worst.item()
        # With SYMMPOOL_COLLECTIVES=always FSDP2's collectives must have run on symmpool.
        own = os.environ.get("SYMMPOOL_COLLECTIVES") == "always"
        ok = worst <= args.rtol and stats["allocations"] > 0 and (not own or stats["symm_collectives"] > 0)
        if dist.get_rank() == 0:
            layout = f"HSDP {args.replicate} x {dist.get_world_size() // args.replicate}" if args.replicate > 1 else "FSDP"
            print(f"world size {dist.get_world_size()} ({layout}), {args.steps} steps, "
                  f"{args.layers} layers of dim {args.dim}")
            print(f"{'backend':<8} {'step ms':>9} {'peak MiB':>9} {'first loss':>11} {'last loss':>11}")
            for name, r in (("nccl", nccl), ("symm", symm)):
                print(f"{name:<8} {r['step_ms_median']:>9.2f} {r['peak_allocated_bytes'] / 2**20:>9.1f} "
                      f"{r['losses'][0]:>11.6f} {r['losses'][-1]:>11.6f}")
            print(f"largest relative loss difference over all ranks and steps: {worst:.3e} (rtol {args.rtol})")
            print("symmpool stats (rank 0):", json.dumps(stats, sort_keys=True))
            print("LOSSES MATCH" if ok else "LOSSES DIFFER OR SYMMPOOL UNUSED")
            if args.json:
                with open(args.json, "w") as f:
                    context = {
                        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                        "gpu": torch.cuda.get_device_name(),
                        "torch": torch.__version__,
                        "cuda": torch.version.cuda,
                        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                        # unset: the algorithm table decides (the default since 2026-11-22)
                        "symmpool_collectives": os.environ.get("SYMMPOOL_COLLECTIVES") or "table",
                    }
                    json.dump({"context": context, "nccl": nccl, "symm": symm, "max_rel_diff": worst,
                               "stats": stats, "world_size": dist.get_world_size(), "args": vars(args)},
                              f, indent=1)
        return 0 if ok else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(main())
