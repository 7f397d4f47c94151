"""Fused tensor-parallel ops on a "symm" group, micro-pipelined as PyTorch's
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
call (not a "symm" group, ranks on several nodes, CPU tensors, one rank, a
workspace that came out asymmetric) the op runs unfused on the group, and
``symmpool.peer_memory_counts()`` counts it with its reason; every rank
takes the same decision. Every op takes ``group_size``: the output shapes
depend on it, and torch.compile's caches key on the op's arguments.
"""

from __future__ import annotations

import math
import warnings
from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group

from . import _C
from ._library import define
from .peer_memory import _counts, symm_backend

_WORKSPACE_GRANULE = 2 << 20  # bytes: workspaces grow in whole granules of the heap


# -- the group's workspace ---------------------------------------------------------------------------


class _Workspace:
    """One group's symmetric staging buffer on one device. The C++ half
    (``cpp``: the buffer, the group's copy stream, where the last op left the
    buffer) is what the pipelines order themselves on; this half decides how
    it grows."""

    def __init__(self, backend, device: int) -> None:
        # A new group under an old name gets a new workspace. Not a (weak)
        # reference to `backend`: each lookup may give a new Python wrapper of
        # the same backend, which replaced the workspace at every call.
        self.backend_serial = backend.serial
        self.cpp = _C.FusedWorkspace(device)
        self.tensor: Optional[torch.Tensor] = None  # uint8, rendezvoused (the C++ half holds it too)
        self.not_symmetric = ""  # why the last growth was refused (same text on every rank)
        self.refused_bytes = 0  # up to this size, larger than `tensor`, calls go to NCCL
        self.kept_for_graphs: list[torch.Tensor] = []  # outgrown but captured: never freed

    def holds(self, nbytes: int) -> bool:
        return self.tensor is not None and self.tensor.numel() >= nbytes


_workspaces: dict[tuple[str, int], _Workspace] = {}


def _workspace(group: dist.ProcessGroup, backend, device: int, nbytes: int) -> _Workspace:
    """The workspace of ``group`` (whose "symm" backend is ``backend``) on
    ``device``, grown to ``nbytes`` where it can be (collective then);
    ``holds(nbytes)`` is False, on every rank, when the larger one came out
    asymmetric."""
    key = (group.group_name, device)
    ws = _workspaces.get(key)
    if ws is None or ws.backend_serial != backend.serial:
        ws = _workspaces[key] = _Workspace(backend, device)
    if ws.holds(nbytes) or nbytes <= ws.refused_bytes:
        return ws
    have = 0 if ws.tensor is None else ws.tensor.numel()
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"symmpool fused ops: the workspace of group {group.group_name!r} holds {have} bytes, "
            f"{nbytes} are needed, and it cannot grow during a CUDA graph capture; call "
            f"symmpool.reserve_workspace({nbytes}, group) on every rank before capturing")
    size = -(-nbytes // _WORKSPACE_GRANULE) * _WORKSPACE_GRANULE
    try:
        tensor = _C._allocate_symmetric(backend, size, device)
    except torch.OutOfMemoryError:
        # The peers are entering the rendezvous below: join them with a byte
        # outside the workspace's shape, so that every rank gets the same
        # "not symmetric" verdict and runs unfused, none left waiting.
        warnings.warn(f"symmpool fused ops: no memory for a {size}-byte workspace of group "
                      f"{group.group_name!r} on rank {group.rank()}; calls that need it run unfused")
        tensor = torch.empty(1, dtype=torch.uint8, device=device)
    why_not = _C._rendezvous(backend, tensor)
    if why_not:  # the old one, if any, keeps serving what it holds
        ws.not_symmetric, ws.refused_bytes = why_not, size
        return ws
    if ws.tensor is not None:
        torch.cuda.synchronize(device)  # our streams are done with it; end barriers: the peers are too
        if ws.cpp.captured:
            ws.kept_for_graphs.append(ws.tensor)  # graphs replay on its addresses
    # The block comes in stream order on the current stream: set_buffer
    # records that, and an op on another stream waits for it (its previous
    # owner's work may still be queued here).
    ws.tensor = tensor
    ws.cpp.set_buffer(tensor)
    ws.not_symmetric, ws.refused_bytes = "", 0
    return ws


def reserve_workspace(nbytes: int, group: Optional[dist.ProcessGroup] = None, device=None) -> bool:
    """Collective: grows the fused ops' workspace of ``group`` to at least
    ``nbytes`` now (before a CUDA graph capture, say). Returns whether the
    fused ops will run on it: False when it came out asymmetric or the
    group spans nodes."""
    group = group if group is not None else dist.group.WORLD
    device = torch.cuda.current_device() if device is None else torch.device("cuda", device).index
    backend = symm_backend(group, device)
    if backend is None:
        raise TypeError("symmpool.reserve_workspace needs a \"symm\" process group")
    if not _C._peer_memory_available(backend, device):
        return False
    return _workspace(group, backend, device, nbytes).holds(nbytes)


def _check_group_size(group_size: int, op: str) -> None:
    if group_size < 1:
        raise ValueError(f"{op}: group_size must be >= 1, got {group_size}")


def _group_of(group_name: str, group_size: int, op: str) -> dist.ProcessGroup:
    group = _resolve_process_group(group_name)
    if group.size() != group_size:
        raise ValueError(f"{op}: group_size is {group_size} but group {group_name!r} has {group.size()} ranks")
    return group


def _fusing(op: str, group: dist.ProcessGroup, tensors: list[torch.Tensor], nbytes: int):
    """(backend, workspace holding ``nbytes``) when symmpool serves the call,
    else (None, None); the same decision on every rank, counted."""
    why_not, backend, ws = "", None, None
    if not all(t.is_cuda for t in tensors):
        why_not = "CPU tensors"
    elif any(t.numel() == 0 for t in tensors):
        why_not = "empty tensors"
    elif group.size() == 1:
        why_not = "one rank"
    else:
        device = tensors[0].device.index
        backend = symm_backend(group, device)
        if backend is None:
            why_not = "not a symm group"
        elif not _C._peer_memory_available(backend, device):
            why_not = "ranks span nodes"
        else:
            ws = _workspace(group, backend, device, nbytes)
            why_not = "" if ws.holds(nbytes) else "workspace not symmetric"
    if why_not:
        _counts[f"{op}.fallback"] += 1
        _counts[f"{op}.fallback: {why_not}"] += 1
        return None, None
    _counts[f"{op}.fused"] += 1
    return backend, ws.cpp


# -- all-gather, then matmul ----------------------------------------------------------------------


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


def _gathered_shape(A_shard, gather_dim: int, group_size: int) -> list[int]:
    shape = list(A_shard.shape)
    shape[gather_dim] *= group_size
    return shape


def _all_gather_matmul_unfused(A_shard, Bs, gather_dim: int, group) -> tuple:
    x = A_shard.movedim(gather_dim, 0).contiguous()
    gathered = x.new_empty((group.size() * x.shape[0], *x.shape[1:]))
    dist.all_gather_into_tensor(gathered, x, group=group)
    A = gathered.movedim(0, gather_dim).contiguous()
    return A, [A @ B for B in Bs]


def _fused_all_gather_matmul(A_shard: torch.Tensor, Bs: list[torch.Tensor], gather_dim: int, group_size: int,
                             group_name: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(all_gather(A_shard, gather_dim), [that @ B for B in Bs]): each
    rank's shard multiplied as soon as it has arrived, one C++ call enqueuing
    the pipeline (as Python loops its host time exceeded the GPU's)."""
    op = "fused_all_gather_matmul"
    gather_dim = _check_all_gather_matmul(A_shard, Bs, gather_dim, group_size)
    group = _group_of(group_name, group_size, op)
    # From A_shard alone: each rank's Bs are its own (an uneven column split
    # may leave one rank's empty), and a decision that differed between
    # ranks would leave one in a collective the others never enter.
    backend, ws = _fusing(op, group, [A_shard], A_shard.numel() * A_shard.element_size())
    if backend is None:
        return _all_gather_matmul_unfused(A_shard, Bs, gather_dim, group)
    last = A_shard.dim() - 1
    if gather_dim == last:  # along K: A @ B sums each shard @ (its rank's rows of B), accumulated as they arrive
        x = A_shard.reshape(-1, A_shard.shape[-1])
        shards, outs = _C._all_gather_matmul(backend, x, Bs, 1, ws)
        lead = A_shard.shape[:-1]
        A = shards.permute(1, 0, 2).reshape(x.shape[0], group_size * x.shape[1])
        return A.view(*lead, -1), [out.view(*lead, -1) for out in outs]
    x = A_shard.movedim(gather_dim, 0)
    A_flat, outs = _C._all_gather_matmul(backend, x.reshape(-1, x.shape[-1]), Bs, 0, ws)
    if A_shard.dim() == 2:  # [M, K] along rows, the common case: nothing to lay out
        return A_flat, outs
    lead = (group_size * x.shape[0], *x.shape[1:-1])

    def shape_out(flat: torch.Tensor) -> torch.Tensor:
        return flat.view(*lead, flat.shape[-1]).movedim(0, gather_dim).contiguous()

    return shape_out(A_flat), [shape_out(out) for out in outs]


def _fused_all_gather_matmul_fake(A_shard, Bs, gather_dim, group_size, group_name):
    gather_dim = _check_all_gather_matmul(A_shard, Bs, gather_dim, group_size)
    shape = _gathered_shape(A_shard, gather_dim, group_size)
    A = A_shard.new_empty(shape)
    return A, [A_shard.new_empty((*shape[:-1], B.shape[1])) for B in Bs]


fused_all_gather_matmul = define(
    "fused_all_gather_matmul(Tensor A_shard, Tensor[] Bs, int gather_dim, int group_size, str group_name) "
    "-> (Tensor, Tensor[])", _fused_all_gather_matmul, _fused_all_gather_matmul_fake)


# -- matmul, then all-to-all or reduce-scatter --------------------------------------------------------


def _check_matmul(A, B, op: str) -> None:
    if A.dim() < 2 or B.dim() != 2 or A.shape[-1] != B.shape[0] or A.dtype != B.dtype:
        raise ValueError(f"{op}: need A [..., k] and B [k, n] of one dtype, got {A.dtype} {tuple(A.shape)} "
                         f"and {B.dtype} {tuple(B.shape)}")


def _check_reduce_scatter(A, B, reduce_op: str, scatter_dim: int, group_size: int) -> int:
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
    return scatter_dim


def _reduce_scatter_shape(A, B, scatter_dim: int, group_size: int) -> list[int]:
    shape = [*A.shape[:-1], B.shape[1]]
    shape[scatter_dim] //= group_size
    return shape


def _matmul_reduce_scatter_unfused(A, B, reduce_op: str, scatter_dim: int, group) -> torch.Tensor:
    product = (A @ B).movedim(scatter_dim, 0).contiguous()
    out = product.new_empty((product.shape[0] // group.size(), *product.shape[1:]))
    op = dist.ReduceOp.SUM if reduce_op == "sum" else dist.ReduceOp.AVG
    dist.reduce_scatter_tensor(out, product, op=op, group=group)
    return out.movedim(0, scatter_dim).contiguous()


def _fused_matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,
                                 group_size: int, group_name: str) -> torch.Tensor:
    """reduce_scatter(A @ B, reduce_op, scatter_dim) over the group: every
    rank's part for rank ``d`` (rows ``d`` of A times B, or A times column
    block ``d`` of B) made in a staging buffer and pushed into rank ``d``'s
    workspace slot by the copy engines while the next one is made, then the
    slots reduced; one C++ call enqueues it all."""
    op = "fused_matmul_reduce_scatter"
    scatter_dim = _check_reduce_scatter(A, B, reduce_op, scatter_dim, group_size)
    group = _group_of(group_name, group_size, op)
    shape = _reduce_scatter_shape(A, B, scatter_dim, group_size)
    backend, ws = _fusing(op, group, [A, B], group_size * math.prod(shape) * A.element_size())
    if backend is None:
        return _matmul_reduce_scatter_unfused(A, B, reduce_op, scatter_dim, group)
    if scatter_dim == A.dim() - 1:  # each rank owns a block of B's columns
        return _C._produce_and_all_to_all(backend, A.reshape(-1, A.shape[-1]), B, 1, ws, reduce_op).view(shape)
    x = A.movedim(scatter_dim, 0)
    flat = _C._produce_and_all_to_all(backend, x.reshape(-1, x.shape[-1]), B, 0, ws, reduce_op)
    if A.dim() == 2:  # [M, N] along rows, the common case: nothing to lay out
        return flat
    moved = [shape[scatter_dim], *(s for i, s in enumerate(shape) if i != scatter_dim)]
    return flat.view(moved).movedim(0, scatter_dim).contiguous()


def _fused_matmul_reduce_scatter_fake(A, B, reduce_op, scatter_dim, group_size, group_name):
    scatter_dim = _check_reduce_scatter(A, B, reduce_op, scatter_dim, group_size)
    return A.new_empty(_reduce_scatter_shape(A, B, scatter_dim, group_size))


fused_matmul_reduce_scatter = define(
    "fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, int group_size, "
    "str group_name) -> Tensor", _fused_matmul_reduce_scatter, _fused_matmul_reduce_scatter_fake)


def _check_all_to_all(A, B, group_size: int) -> None:
    op = "pipelined_produce_and_all_to_all"
    _check_group_size(group_size, op)
    _check_matmul(A, B, op)
    if A.dim() != 2 or A.shape[0] % group_size:
        raise ValueError(f"{op}: A must be a matrix whose rows ({A.shape[0] if A.dim() else 0}) divide by the "
                         f"group size {group_size}, got {tuple(A.shape)}")


def _pipelined_produce_and_all_to_all(A: torch.Tensor, B: torch.Tensor, group_size: int,
                                      group_name: str) -> torch.Tensor:
    """all_to_all_single(A @ B) with equal chunks along dim 0: rows chunk
    ``s`` of the result is rank ``s``'s product's chunk for this rank."""
    op = "pipelined_produce_and_all_to_all"
    _check_all_to_all(A, B, group_size)
    group = _group_of(group_name, group_size, op)
    n = B.shape[1]
    backend, ws = _fusing(op, group, [A, B], A.shape[0] * n * A.element_size())
    if backend is None:
        out = A.new_empty(A.shape[0], n)
        dist.all_to_all_single(out, (A @ B).contiguous(), group=group)
        return out
    return _C._produce_and_all_to_all(backend, A, B, 0, ws, "none").view(A.shape[0], n)


def _pipelined_produce_and_all_to_all_fake(A, B, group_size, group_name):
    _check_all_to_all(A, B, group_size)
    return A.new_empty(A.shape[0], B.shape[1])


pipelined_produce_and_all_to_all = define(
    "pipelined_produce_and_all_to_all(Tensor A, Tensor B, int group_size, str group_name) -> Tensor",
    _pipelined_produce_and_all_to_all, _pipelined_produce_and_all_to_all_fake)
