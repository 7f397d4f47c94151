"""FSDP2 on a plain "nccl" mesh with symmpool.fsdp.enable: the same losses as
stock FSDP2, bit for bit, with eager or compiled blocks and either
reshard_after_forward; with SYMMPOOL_COLLECTIVES=always FSDP2's collectives
run on symmpool."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from dist_common import every_ranks, init_group, reduction_reference, set_collectives_mode

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))


def _losses(mesh: DeviceMesh, hooks: bool, reshard: bool, compiled: bool, steps: int = 4) -> list[float]:
    import fsdp2_train
    import symmpool

    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    vocab, dim, seq = 512, 128, 64
    model = fsdp2_train.TinyTransformer(vocab, dim, 2, 4, seq).to(device)
    for i, layer in enumerate(model.layers):
        if compiled:
            model.layers[i] = layer = torch.compile(layer)
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    if hooks:
        assert symmpool.fsdp.enable(model) == 3
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator(device="cpu").manual_seed(1 + dist.get_rank())
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (4, seq + 1), generator=data).to(device)
        loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def hooked_losses_match_stock(rank: int, world: int, collectives: str, reshard: bool, compiled: bool) -> None:
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS, before CUDA starts
    set_collectives_mode(collectives)
    import symmpool

    torch.use_deterministic_algorithms(True)
    device = init_group(rank, world, "cpu:gloo,cuda:nccl")  # a plain NCCL job
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cuda")
    stock = _losses(mesh, hooks=False, reshard=reshard, compiled=compiled)
    before = symmpool.memory_stats(device)
    hooked = _losses(mesh, hooks=True, reshard=reshard, compiled=compiled)
    after = symmpool.memory_stats(device)
    assert hooked == stock, f"losses differ: stock {stock}, symmpool hooks {hooked}"
    assert after["allocations"] > before["allocations"], "FSDP2's buffers did not come from symmpool"
    if collectives == "always" and world > 1:  # FSDP2 skips its collectives on one rank
        assert after["symm_collectives"] > before["symm_collectives"], "no collective ran on symmpool"
    symmpool.fsdp.release()
    dist.destroy_process_group()


def hook_collectives_match_gloo(rank: int, world: int) -> None:
    """The hooks' all-gather and reduce-scatter on a plain "nccl" group with
    SYMMPOOL_COLLECTIVES=always run on symmpool (no NCCL call: ranks may
    share a GPU) and match gloo's exact reference, odd sizes, every dtype."""
    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    import symmpool

    device = init_group(rank, world, "cpu:gloo,cuda:nccl")
    group = dist.group.WORLD
    all_gather, reduce_scatter = symmpool.fsdp.SymmAllGather(), symmpool.fsdp.SymmReduceScatter()
    gen = torch.Generator().manual_seed(7 + rank)
    calls = 0
    before = symmpool.memory_stats(device)["symm_collectives"]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for n in (1, 1009, 4099, (1 << 18) + 3):
            inp = all_gather.allocate((n,), dtype=dtype, device=device)
            inp.copy_(torch.randn(n, generator=gen).to(dtype))
            out = all_gather.allocate((n * world,), dtype=dtype, device=device).fill_(float("nan"))
            assert all_gather(out, inp, group) is None  # ran on the current stream
            assert torch.equal(out.cpu(), torch.cat(every_ranks(inp))), f"all_gather {dtype} x {n}"
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                rs_in = reduce_scatter.allocate((n * world,), dtype=dtype, device=device)
                rs_in.copy_(torch.randn(n * world, generator=gen).to(dtype))
                rs_out = reduce_scatter.allocate((n,), dtype=dtype, device=device).fill_(float("nan"))
                want = reduction_reference(rs_in, op)[rank * n:(rank + 1) * n]
                assert reduce_scatter(rs_out, rs_in, group, op) is None
                assert torch.equal(rs_out.cpu(), want), f"reduce_scatter {op} {dtype} x {n}"
            calls += 3
    torch.cuda.synchronize(device)
    assert symmpool.memory_stats(device)["symm_collectives"] - before == calls
    assert symmpool.fsdp.release(group)
    dist.destroy_process_group()


def hsdp_placement_with_simulated_hosts(rank: int, world: int, layout: str) -> None:
    """An HSDP mesh (replicate x shard) over two simulated hosts
    (SYMMPOOL_HOST_ID), with SYMMPOOL_COLLECTIVES=always. The hooks' group
    runs on symmpool where its ranks share a host, and is handed back to
    NCCL (the hook returns False, counted "group spans nodes") where they
    do not. `layout` "shard-in-host": hosts are mesh rows, as on real HSDP
    nodes; "shard-across-hosts": hosts are mesh columns. Only symmpool
    runs (the ranks may share a GPU, which NCCL refuses)."""
    assert world % 2 == 0, world
    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    shard_size = world // 2
    # The mesh is (2, world / 2): rows are replicas.
    os.environ["SYMMPOOL_HOST_ID"] = f"host-{symmpool_host(rank, layout, shard_size)}"
    import symmpool

    device = init_group(rank, world, "cpu:gloo,cuda:nccl")
    mesh = DeviceMesh("cuda", torch.arange(world).reshape(2, shard_size), mesh_dim_names=("replicate", "shard"))
    torch.cuda.set_device(device)  # the mesh may pick rank % GPUs; the ranks may share GPU 0
    all_gather = symmpool.fsdp.SymmAllGather()
    n = 1031
    for dim in ("shard", "replicate"):
        group = mesh.get_group(dim)
        members = dist.get_process_group_ranks(group)
        in_one_host = len({symmpool_host(r, layout, shard_size) for r in members}) == 1
        spans_before = symmpool._C.routing_counts()["group spans nodes"]
        inp = all_gather.allocate((n,), dtype=torch.float32, device=device)
        inp.copy_(torch.arange(n, dtype=torch.float32) + rank)
        out = all_gather.allocate((n * len(members),), dtype=torch.float32, device=device).fill_(float("nan"))
        ran = symmpool._C.group_all_gather(group.group_name, out, inp)
        assert ran == in_one_host, f"rank {rank} {layout} {dim} {members}: symmpool ran it: {ran}"
        if ran:
            want = torch.cat([torch.arange(n, dtype=torch.float32) + r for r in members])
            assert torch.equal(out.cpu(), want), f"rank {rank} {layout} {dim}: wrong all-gather"
        else:
            assert symmpool._C.routing_counts()["group spans nodes"] == spans_before + 1
        symmpool.release_group(group)
    torch.cuda.synchronize(device)
    print(f"[rank {rank}] {layout}: symmpool where the group shares a host, NCCL elsewhere", flush=True)
    dist.destroy_process_group()


def symmpool_host(rank: int, layout: str, shard_size: int) -> int:
    row, column = divmod(rank, shard_size)
    return row if layout == "shard-in-host" else column
