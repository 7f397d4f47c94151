"""Fused tensor-parallel ops on a "nccl" or "symm" group (a DeviceMesh's tp
dimension as it is), micro-pipelined as PyTorch's
ProcessGroupCudaP2P and symmetric-memory ops are:

- ``torch.ops.symmpool.fused_all_gather_matmul(A_shard, Bs, gather_dim,
  group_size, group_name) -> (A, [A @ B for B in Bs])``: each rank's shard is
  multiplied as soon as it has arrived, while the copy engines fetch the next;
- ``torch.ops.symmpool.fused_matmul_reduce_scatter(A, B, reduce_op,
  scatter_dim, group_size, group_name)``: ``reduce_scatter(A @ B)``, each
  rank's part of the product computed and pushed to it by the copy engines
  while the next part is computed;
- ``torch.ops.symmpool.pipelined_produce_and_all_to_all(A, B, group_size,
  group_name)``: ``all_to_all_single(A @ B)`` with equal chunks along dim 0
  (chunk ``s`` of the output comes from rank ``s``), pipelined the same way.

The copies take no SM from the matmuls. Shards pass through one symmetric
workspace per group and device, grown on demand (``reserve_workspace`` grows
it ahead, as a CUDA graph capture needs). Where symmpool cannot serve the
call (a group whose CUDA backend is neither "nccl" nor "symm", ranks on several nodes, CPU tensors, one rank, a
workspace that came out asymmetric) the op runs unfused on the group, and
``symmpool.peer_memory_counts()`` counts it with its reason; every rank
takes the same decision. Every op takes ``group_size``: the output shapes
depend on it, and torch.compile's caches key on the op's arguments.

The ops' kernels are C++ (``bindings/torch/tp/fused_ops.cpp``: checks, the
decision, the pipeline or the fallback); this module defines their schemas
and the fake kernels torch.compile traces with, which check the arguments
as the C++ kernels do and take every shape from the arguments alone.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from . import _C
from ._library import define


def reserve_workspace(nbytes: int, group: Optional[dist.ProcessGroup] = None, device=None) -> bool:
    """Collective: grows the fused ops' workspace of ``group`` to at least
    ``nbytes`` now (before a CUDA graph capture, say). Returns whether the
    fused ops will run on it: False when it came out asymmetric or the
    group spans nodes."""
    group = group if group is not None else dist.group.WORLD
    device = torch.cuda.current_device() if device is None else torch.device("cuda", device).index
    return _C._reserve_workspace(group.group_name, device, nbytes)  # TypeError unless "nccl" or "symm"


# -- fake kernels: the C++ kernels' checks and shapes, from the arguments alone ---------------------


def _check_group_size(group_size: int, op: str) -> None:
    if group_size < 1:
        raise ValueError(f"{op}: group_size must be >= 1, got {group_size}")


def _check_all_gather_matmul(A_shard, Bs, gather_dim: int, group_size: int) -> int:
    op = "fused_all_gather_matmul"
    _check_group_size(group_size, op)
    if A_shard.dim() < 2:
        raise ValueError(f"{op}: A_shard must have at least 2 dims, got {A_shard.dim()}")
    if not -A_shard.dim() <= gather_dim < A_shard.dim():
        raise ValueError(f"{op}: gather_dim {gather_dim} is out of range for {A_shard.dim()} dims")
    gather_dim %= A_shard.dim()
    k = A_shard.shape[-1] * (group_size if gather_dim == A_shard.dim() - 1 else 1)
    if not Bs:
        raise ValueError(f"{op}: Bs is empty")
    for B in Bs:
        if B.dim() != 2 or B.shape[0] != k or B.dtype != A_shard.dtype or B.device != A_shard.device:
            raise ValueError(f"{op}: every B must be a {A_shard.dtype} matrix of {k} rows on {A_shard.device}, "
                             f"got {B.dtype} {tuple(B.shape)} on {B.device}")
    return gather_dim


def _fused_all_gather_matmul_fake(A_shard, Bs, gather_dim, group_size, group_name):
    gather_dim = _check_all_gather_matmul(A_shard, Bs, gather_dim, group_size)
    shape = list(A_shard.shape)
    shape[gather_dim] *= group_size
    A = A_shard.new_empty(shape)
    return A, [A_shard.new_empty((*shape[:-1], B.shape[1])) for B in Bs]


def _check_matmul(A, B, op: str) -> None:
    if A.dim() < 2 or B.dim() != 2 or A.shape[-1] != B.shape[0] or A.dtype != B.dtype:
        raise ValueError(f"{op}: need A [..., k] and B [k, n] of one dtype, got {A.dtype} {tuple(A.shape)} "
                         f"and {B.dtype} {tuple(B.shape)}")


def _fused_matmul_reduce_scatter_fake(A, B, reduce_op, scatter_dim, group_size, group_name):
    op = "fused_matmul_reduce_scatter"
    _check_group_size(group_size, op)
    _check_matmul(A, B, op)
    if reduce_op not in ("sum", "avg"):
        raise ValueError(f"{op}: reduce_op must be 'sum' or 'avg', got {reduce_op!r}")
    if not -A.dim() <= scatter_dim < A.dim():
        raise ValueError(f"{op}: scatter_dim {scatter_dim} is out of range for {A.dim()} dims")
    scatter_dim %= A.dim()
    extent = B.shape[1] if scatter_dim == A.dim() - 1 else A.shape[scatter_dim]
    if extent % group_size:
        raise ValueError(f"{op}: dim {scatter_dim} of A @ B ({extent}) is not divisible by the group size "
                         f"{group_size}")
    shape = [*A.shape[:-1], B.shape[1]]
    shape[scatter_dim] //= group_size
    return A.new_empty(shape)


def _pipelined_produce_and_all_to_all_fake(A, B, group_size, group_name):
    op = "pipelined_produce_and_all_to_all"
    _check_group_size(group_size, op)
    _check_matmul(A, B, op)
    if A.dim() != 2 or A.shape[0] % group_size:
        raise ValueError(f"{op}: A must be a matrix whose rows ({A.shape[0] if A.dim() else 0}) divide by the "
                         f"group size {group_size}, got {tuple(A.shape)}")
    return A.new_empty(A.shape[0], B.shape[1])


fused_all_gather_matmul = define(
    "fused_all_gather_matmul(Tensor A_shard, Tensor[] Bs, int gather_dim, int group_size, str group_name) "
    "-> (Tensor, Tensor[])", None, _fused_all_gather_matmul_fake)
fused_matmul_reduce_scatter = define(
    "fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, int group_size, "
    "str group_name) -> Tensor", None, _fused_matmul_reduce_scatter_fake)
pipelined_produce_and_all_to_all = define(
    "pipelined_produce_and_all_to_all(Tensor A, Tensor B, int group_size, str group_name) -> Tensor", None,
    _pipelined_produce_and_all_to_all_fake)
_C._impl_fused_ops()
