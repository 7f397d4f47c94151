"""Bodies of the multi-GPU tests of group layouts: several "symm" groups on
the same GPUs, DeviceMesh dimensions, groups spanning nodes; one call per
rank (see launch.py)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from dist_common import init_group, poisoned


def a_group_spanning_nodes_runs_on_nccl(rank: int, world: int) -> None:
    """SYMMPOOL_HOST_ID makes every rank look like its own node: the group's
    heap cannot form, so every collective, even on symm tensors with
    SYMMPOOL_COLLECTIVES=always, runs on NCCL, correctly, with no error."""
    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    os.environ["SYMMPOOL_HOST_ID"] = f"node-{rank}"
    import symmpool

    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    backend = dist.group.WORLD._get_backend(device)
    n, dtype = 4099, torch.float32
    x = torch.arange(n, dtype=dtype, device=device) + rank
    for _ in range(3):
        ag_in = backend.allocate_tensor(n, dtype=dtype, device=device)
        ag_in.copy_(x)
        ag_out = poisoned(backend, n * world, dtype, device)
        dist.all_gather_into_tensor(ag_out, ag_in)
        expected = torch.cat([torch.arange(n, dtype=dtype, device=device) + r for r in range(world)])
        assert torch.equal(ag_out, expected), f"all-gather differs on rank {rank}"
        ar = backend.allocate_tensor(n, dtype=dtype, device=device)
        ar.copy_(x)
        dist.all_reduce(ar)
        assert torch.equal(ar, sum(torch.arange(n, dtype=dtype, device=device) + r for r in range(world)))
    stats = symmpool.memory_stats(device)
    assert stats["symm_collectives"] == 0 and stats["nccl_fallbacks"] == 6, stats
    print(f"[rank {rank}] spanning 'nodes': 6 collectives on NCCL, 0 on symmpool", flush=True)
    dist.destroy_process_group()


def several_symm_groups_share_the_gpus(rank: int, world: int, default_backend: str) -> None:
    """A 2-D layout's groups on the same GPUs, each with its own heap over the
    one allocator per GPU: a group of all ranks (two when the default group is
    "symm" too) and subgroups of half the ranks (one rank each on 2 GPUs),
    whose NCCL communicators torch splits from the default group's, the
    ranks outside a subgroup joining with perform_nocolor_split. Their
    collectives interleave; each runs on symmpool (SYMMPOOL_COLLECTIVES=always)
    and matches the same call on plain tensors (NCCL), also with buffers that
    another group's backend allocated."""
    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    import symmpool

    device = init_group(rank, world, f"cpu:gloo,cuda:{default_backend}")
    twin = dist.new_group(list(range(world)), backend="symm")
    half, _ = dist.new_subgroups(group_size=max(1, world // 2), backend="symm")
    groups = {"twin": twin, "half": half}
    if default_backend == "symm":
        groups["world"] = dist.group.WORLD
    backends = {name: g._get_backend(device) for name, g in groups.items()}
    gen = torch.Generator().manual_seed(99 + rank)

    def rand(n, dtype):  # random small integers: exact in any summation order
        return torch.randint(-8, 9, (n,), generator=gen).to(dtype).to(device)

    def symm_copy(owner, t):
        s = backends[owner].allocate_tensor(t.numel(), dtype=t.dtype, device=device)
        return s.copy_(t)

    def on_symmpool(call):  # runs call(); True when it ran on symmpool
        torch.cuda.synchronize()
        before = symmpool.memory_stats(device)["symm_collectives"]
        call()
        torch.cuda.synchronize()
        return symmpool.memory_stats(device)["symm_collectives"] == before + 1

    ran = 0
    for dtype in (torch.bfloat16, torch.float32):
        for n in (1001, 65537):
            for name, group in groups.items():
                for owner in (name, "twin"):  # own buffers, then another group's
                    size = dist.get_world_size(group)
                    where = f"{name} group, {owner}'s buffers, {dtype} n={n} rank={rank}"
                    x = rand(n, dtype)
                    plain = torch.full((n * size,), float("nan"), dtype=dtype, device=device)
                    dist.all_gather_into_tensor(plain, x, group=group)
                    sx, out = symm_copy(owner, x), poisoned(backends[owner], n * size, dtype, device)
                    assert on_symmpool(lambda: dist.all_gather_into_tensor(out, sx, group=group)), where
                    assert torch.equal(out, plain), f"all-gather differs: {where}"

                    y = rand(n * size, dtype)
                    plain_rs = torch.full((n,), float("nan"), dtype=dtype, device=device)
                    dist.reduce_scatter_tensor(plain_rs, y, group=group)
                    sy, rs = symm_copy(owner, y), poisoned(backends[owner], n, dtype, device)
                    assert on_symmpool(lambda: dist.reduce_scatter_tensor(rs, sy, group=group)), where
                    assert torch.equal(rs, plain_rs), f"reduce-scatter differs: {where}"

                    z = rand(n, dtype)
                    sz = symm_copy(owner, z)
                    dist.all_reduce(z, group=group)
                    assert on_symmpool(lambda: dist.all_reduce(sz, group=group)), where
                    assert torch.equal(sz, z), f"all-reduce differs: {where}"
                    ran += 3
    print(f"[rank {rank}] default {default_backend}: {ran} collectives over {len(groups)} symm groups "
          "ran on symmpool and matched NCCL", flush=True)
    dist.destroy_process_group()


def device_mesh_dims_of_a_symm_group_are_symm(rank: int, world: int) -> None:
    """DeviceMesh splits the default group for each dimension (dist.split_group
    through the backend's split): with "symm" as the default, every dimension's
    group is "symm" too, so FSDP2 on a 2-D mesh gets symmpool memory; ranks
    outside a split's piece join it too; the parent group still works after."""
    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    import symmpool
    from torch.distributed.device_mesh import init_device_mesh

    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    mesh = init_device_mesh("cuda", (world, 1), mesh_dim_names=("shard", "replicate"))
    only_rank_0 = dist.split_group(split_ranks=[[0]])  # rank 1.. join without a color
    assert (only_rank_0 is None) == (rank != 0)
    for name in ("shard", "replicate"):
        group = mesh[name].get_group()
        backend = group._get_backend(device)
        assert isinstance(backend, symmpool._C.SymmBackend), f"{name}: {type(backend).__name__}"
        assert backend.supports_tensor_alloc(device), name
        size = dist.get_world_size(group)
        x = backend.allocate_tensor(4099, dtype=torch.float32, device=device)
        x.copy_(torch.arange(4099, dtype=torch.float32, device=device) + rank)
        before = symmpool.memory_stats(device)["symm_collectives"]
        dist.all_reduce(x, group=group)
        torch.cuda.synchronize()
        assert symmpool.memory_stats(device)["symm_collectives"] == before + 1, name
        ranks = dist.get_process_group_ranks(group)
        expected = sum(torch.arange(4099, dtype=torch.float32, device=device) + r for r in ranks)
        assert torch.equal(x, expected), f"all-reduce over the {name} dimension ({size} ranks) differs"
    total = torch.ones(1, device=device)
    dist.all_reduce(total)
    assert total.item() == world
    print(f"[rank {rank}] mesh dims ({world}, 1) are symm groups; split_group joined; parent works", flush=True)
    dist.destroy_process_group()
