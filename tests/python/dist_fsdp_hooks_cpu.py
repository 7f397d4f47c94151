"""symmpool.fsdp.enable where no GPU is needed: which modules get the hooks,
over which group, and what torch forbids (gloo, CPU tensors: the hooks then
call torch.distributed's collective, as they do for what symmpool turns down)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def _sharded(mesh) -> nn.Module:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    return fully_shard(model, mesh=mesh)


def enable_installs_hooks_over_the_shard_group(rank: int, world: int) -> None:
    import symmpool

    dist.init_process_group("gloo", rank=rank, world_size=world)
    # HSDP: replicate x shard. The hooks carry the shard dimension's
    # collectives; the replicate dimension's all-reduce stays FSDP2's own.
    mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("replicate", "shard"))
    model = _sharded(mesh)
    assert symmpool.fsdp.enable(model) == 3
    seen = []
    real_all_gather = dist.all_gather_into_tensor

    def recording(output, input, group=None, async_op=False):
        seen.append(group)
        return real_all_gather(output, input, group=group, async_op=async_op)

    dist.all_gather_into_tensor = recording
    try:
        model(torch.randn(2, 8)).sum().backward()
    finally:
        dist.all_gather_into_tensor = real_all_gather
    shard = mesh.get_group("shard")
    assert seen and all(g is shard for g in seen), (seen, shard)
    for m in (model, model[0], model[2]):
        group = m._get_fsdp_state()._fsdp_param_group
        if group is not None:
            assert isinstance(group._all_gather_comm, symmpool.fsdp.SymmAllGather)
            assert isinstance(group._reduce_scatter_comm, symmpool.fsdp.SymmReduceScatter)

    # What torch does not combine with custom collectives, and what is no FSDP2 model.
    flagged = _sharded(mesh)
    flagged[0].set_allocate_memory_from_process_group_for_comm(True)
    try:
        symmpool.fsdp.enable(flagged)
    except RuntimeError as e:
        assert "set_allocate_memory_from_process_group_for_comm" in str(e), e
    else:
        raise AssertionError("enable() took a module with the process-group allocation flag on")
    try:
        symmpool.fsdp.enable(nn.Linear(2, 2))
    except ValueError as e:
        assert "no FSDP2 module" in str(e), e
    else:
        raise AssertionError("enable() took a model without FSDP2 modules")
    dist.destroy_process_group()
