"""Functional, traceable collectives: ``torch.ops.symmpool.*``.

Each op takes the process group by name (``group.group_name``) and returns a
new tensor, so ``torch.compile`` can trace it through its fake (meta)
implementation. At run time it goes through the group's backend: on a
"symm" group, symmetric buffers run symmpool's collectives and the rest NCCL.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}


def _reduce_op(op: str) -> dist.ReduceOp:
    try:
        return _REDUCE_OPS[op]
    except KeyError:
        raise ValueError(f"symmpool ops reduce with 'sum' or 'avg', got {op!r}") from None


def _world(group_name: str) -> int:
    return _resolve_process_group(group_name).size()


@torch.library.custom_op("symmpool::all_gather", mutates_args=())
def all_gather(input: torch.Tensor, group_name: str) -> torch.Tensor:
    """Concatenation along dim 0 of every rank's ``input``."""
    group = _resolve_process_group(group_name)
    out = input.new_empty((group.size() * input.shape[0], *input.shape[1:]))
    dist.all_gather_into_tensor(out, input.contiguous(), group=group)
    return out


@all_gather.register_fake
def _(input, group_name):
    return input.new_empty((_world(group_name) * input.shape[0], *input.shape[1:]))


@torch.library.custom_op("symmpool::reduce_scatter", mutates_args=())
def reduce_scatter(input: torch.Tensor, op: str, group_name: str) -> torch.Tensor:
    """This rank's dim-0 shard of the reduction of every rank's ``input``."""
    group = _resolve_process_group(group_name)
    world = group.size()
    if input.shape[0] % world:
        raise ValueError(f"reduce_scatter: dim 0 ({input.shape[0]}) is not divisible by the group size {world}")
    out = input.new_empty((input.shape[0] // world, *input.shape[1:]))
    dist.reduce_scatter_tensor(out, input.contiguous(), op=_reduce_op(op), group=group)
    return out


@reduce_scatter.register_fake
def _(input, op, group_name):
    _reduce_op(op)
    world = _world(group_name)
    if input.shape[0] % world:
        raise ValueError(f"reduce_scatter: dim 0 ({input.shape[0]}) is not divisible by the group size {world}")
    return input.new_empty((input.shape[0] // world, *input.shape[1:]))


@torch.library.custom_op("symmpool::all_reduce", mutates_args=())
def all_reduce(input: torch.Tensor, op: str, group_name: str) -> torch.Tensor:
    """The reduction of every rank's ``input``, as a new tensor."""
    out = input.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, op=_reduce_op(op), group=_resolve_process_group(group_name))
    return out


@all_reduce.register_fake
def _(input, op, group_name):
    _reduce_op(op)
    return torch.empty_like(input, memory_format=torch.contiguous_format)
