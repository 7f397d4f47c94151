"""FSDP2 on symmpool from a plain "nccl" job: one call.

    model = fully_shard(...)            # any DeviceMesh of "nccl" groups
    symmpool.fsdp.enable(model)         # every FSDP module, its shard group

Every FSDP2 module then takes its all-gather and reduce-scatter buffers from
symmpool's memory (the symmetric heap of the module's shard group, formed
on first use over that group's own store) and runs those collectives on
symmpool's zero-copy kernels where the group is on one node and the
algorithm table prefers them, on the group's own NCCL elsewhere (the same
decision on every rank). An HSDP mesh's replicate dimension stays with
FSDP2's own all-reduce on NCCL. torch's FSDPModule.set_custom_all_gather and
set_custom_reduce_scatter carry it (torch 2.11).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (ProcessGroupAllocAllGather,
                                                                    ProcessGroupAllocReduceScatter)

from . import _C
from ._backend import BACKEND_NAME
from .peer_memory import release_group

_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg"}


def _symmpool_may_take(group: dist.ProcessGroup, tensor: torch.Tensor) -> bool:
    """CUDA tensors of a group whose CUDA backend is not "symm" (a "symm"
    group routes its own calls: dist's collective reaches it)."""
    return tensor.is_cuda and group._get_backend(tensor.device).name() != BACKEND_NAME


class _SymmetricAlloc:
    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        if torch.device(device).type != "cuda":  # symmpool holds CUDA memory only
            return torch.empty(*size, dtype=dtype, device=device)
        return _C.empty_symmetric(math.prod(int(s) for s in size), dtype, device).view(*size)


class SymmAllGather(_SymmetricAlloc, AllGather):
    """FSDP2's all-gather on symmpool where it runs there, the group's NCCL elsewhere."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        # On the current stream (FSDP2's all-gather stream): its event covers the call.
        if _symmpool_may_take(group, output_tensor) and _C.group_all_gather(
                group.group_name, output_tensor, input_tensor):
            return None
        return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


class SymmReduceScatter(_SymmetricAlloc, ReduceScatter):
    """FSDP2's reduce-scatter on symmpool for sum and avg, where it runs there;
    other reductions (premultiplied sums) and other groups on the group's NCCL."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op=dist.ReduceOp.SUM, async_op: bool = False) -> dist.Work | None:
        name = _OPS.get(op) if isinstance(op, dist.ReduceOp.RedOpType) else None
        if name is not None and _symmpool_may_take(group, output_tensor) and _C.group_reduce_scatter(
                group.group_name, output_tensor, input_tensor, name):
            return None
        return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)


def enable(module: nn.Module) -> int:
    """Puts every FSDP2 module in ``module`` (itself included) on symmpool's
    all-gather and reduce-scatter, over each module's shard group; returns
    how many modules. Raises ValueError where ``module`` holds no FSDP2
    module, and RuntimeError where torch forbids custom collectives: a module
    with set_allocate_memory_from_process_group_for_comm on, or with more
    than one parameter group."""
    modules = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise ValueError("symmpool.fsdp.enable: no FSDP2 module found: call fully_shard on the model first")
    for m in modules:
        state = m._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is not None and len(groups) > 1:
            raise RuntimeError(f"symmpool.fsdp.enable: {type(m).__name__} has {len(groups)} parameter groups; "
                               "torch takes custom collectives for one only")
        param_group = state._fsdp_param_group
        if param_group is None:
            continue  # no parameters of its own: nothing to gather
        if isinstance(param_group._all_gather_comm, ProcessGroupAllocAllGather) or isinstance(
                param_group._reduce_scatter_comm, ProcessGroupAllocReduceScatter):
            raise RuntimeError(f"symmpool.fsdp.enable: {type(m).__name__} has "
                               "set_allocate_memory_from_process_group_for_comm on, which torch does not combine "
                               "with custom collectives: turn it off, or use the \"symm\" backend with it instead")
        m.set_custom_all_gather(SymmAllGather())
        m.set_custom_reduce_scatter(SymmReduceScatter())
    return len(modules)


def release(group: dist.ProcessGroup | None = None) -> bool:
    """Drops the symmetric heap and communicator symmpool formed for ``group``
    (the default group where None): call it before dist.destroy_process_group
    on a group whose FSDP2 modules are gone. False where it had none."""
    return release_group(group)
