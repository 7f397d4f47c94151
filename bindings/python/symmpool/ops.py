"""Functional, traceable collectives: ``torch.ops.symmpool.*``.

    symmpool::all_gather(Tensor input, int group_size, str group_name) -> Tensor
    symmpool::reduce_scatter(Tensor input, str op, int group_size, str group_name) -> Tensor
    symmpool::all_reduce(Tensor input, str op, str group_name) -> Tensor
    symmpool::all_reduce_(Tensor(a!) input, str op, str group_name) -> ()

Each op takes the process group by name (``group.group_name``) and returns a
new tensor, so ``torch.compile`` can trace it through its fake (meta)
implementation; ``all_reduce_`` reduces its input in place instead, as
``torch.ops.symm_mem.two_shot_all_reduce_`` does (no output to allocate: on a
"symm" group a symmetric input runs symmpool's all-reduce at every size, a
plain one the low-latency kernel up to its limit and NCCL above). It returns
nothing, as a custom op that mutates its input must for ``torch.compile``
to functionalize it. Ops whose output shape depends on the group size also take
``group_size``, placed as in PyTorch's ``_c10d_functional`` ops: their fake
implementations compute shapes from it alone, never from the group, so the
size is an argument in the traced graph and in the keys of the compile caches
(a graph compiled on 2 ranks is not reused on 1). At run time an op raises
ValueError when ``group_size`` is not the group's size, then goes through the
group's backend: on a "symm" group, symmetric buffers run symmpool's
collectives and the rest NCCL.

The kernels are C++ (``bindings/torch/ops/functional_ops.cpp``): a call costs the
backend's host time, without torch.distributed's Python wrapper.
"""

from __future__ import annotations

import torch

from . import _C
from ._library import define


def _reduce_op(op: str) -> None:
    if op not in ("sum", "avg"):
        raise ValueError(f"symmpool ops reduce with 'sum' or 'avg', got {op!r}")


def _check_group_size(op_name: str, group_size: int) -> None:
    if group_size < 1:
        raise ValueError(f"symmpool::{op_name}: group_size must be >= 1, got {group_size}")


def _rows(op_name: str, input) -> int:
    if input.dim() < 1:
        raise ValueError(f"symmpool::{op_name}: the input needs at least one dim, got a scalar")
    return input.shape[0]


def _scattered_rows(rows, group_size: int):
    if rows % group_size:
        raise ValueError(f"symmpool::reduce_scatter: dim 0 ({rows}) is not divisible by "
                         f"group_size {group_size}")
    return rows // group_size


# Fake kernels: the C++ kernels' checks and shapes, from the arguments alone.
# Explicit schemas: `int group_size` (inferred, it would be SymInt), a
# constant of the graph as in _c10d_functional.
def _all_gather_fake(input, group_size, group_name):
    _check_group_size("all_gather", group_size)
    return input.new_empty((group_size * _rows("all_gather", input), *input.shape[1:]))


all_gather = define("all_gather(Tensor input, int group_size, str group_name) -> Tensor", None, _all_gather_fake)


def _reduce_scatter_fake(input, op, group_size, group_name):
    _reduce_op(op)
    _check_group_size("reduce_scatter", group_size)
    return input.new_empty((_scattered_rows(_rows("reduce_scatter", input), group_size), *input.shape[1:]))


reduce_scatter = define("reduce_scatter(Tensor input, str op, int group_size, str group_name) -> Tensor", None,
                        _reduce_scatter_fake)


# No group_size: the output has the input's shape whatever the group's size,
# so a graph compiled for one size is right for any other.
def _all_reduce_fake(input, op, group_name):
    _reduce_op(op)
    return torch.empty_like(input, memory_format=torch.contiguous_format)


all_reduce = define("all_reduce(Tensor input, str op, str group_name) -> Tensor", None, _all_reduce_fake)


def _all_reduce_in_place_fake(input, op, group_name):
    _reduce_op(op)


all_reduce_ = define("all_reduce_(Tensor(a!) input, str op, str group_name) -> ()", None,
                     _all_reduce_in_place_fake)
_C._impl_functional_ops()
