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

import warnings
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group

from . import _C
from .peer_memory import _counts, symm_backend

_WORKSPACE_GRANULE = 2 << 20  # bytes: workspaces grow in whole granules of the heap


# -- the group's workspace and copy stream ---------------------------------------------------


class _Workspace:
    """One group's symmetric staging buffer on one device."""

    def __init__(self, backend, device: int) -> None:
        # A new group under an old name gets a new workspace. Not a (weak)
        # reference to `backend`: each lookup may give a new Python wrapper of
        # the same backend, which replaced the workspace at every call.
        self.backend_serial = backend.serial
        self.tensor: Optional[torch.Tensor] = None  # uint8, rendezvoused
        self.not_symmetric = ""  # why the last growth was refused (same text on every rank)
        self.refused_bytes = 0  # up to this size, larger than `tensor`, calls go to NCCL
        self.last_use: Optional[torch.cuda.Event] = None  # the stream's position after the last op read it
        self.captured = False  # a CUDA graph holds `tensor`'s addresses
        # The group's own copy stream: it carries the group's first barrier,
        # and one shared by groups could order two groups' barriers
        # differently on two ranks (a cycle), as NCCL gives each
        # communicator its own internal streams.
        self.copies = torch.cuda.Stream(device)
        self.kept_for_graphs: list[torch.Tensor] = []  # outgrown but captured: never freed

    def holds(self, nbytes: int) -> bool:
        return self.tensor is not None and self.tensor.numel() >= nbytes


_workspaces: dict[tuple[str, int], _Workspace] = {}


def _workspace(group: dist.ProcessGroup, device: int, nbytes: int) -> _Workspace:
    """The workspace of ``group`` on ``device``, grown to ``nbytes`` where it
    can be (collective then); ``holds(nbytes)`` is False, on every rank,
    when the larger one came out asymmetric."""
    backend = symm_backend(group, device)
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
        if ws.captured:
            ws.kept_for_graphs.append(ws.tensor)  # graphs replay on its addresses
    # The block comes in stream order on this stream: an op on another stream
    # waits for it (its previous owner's work may still be queued here).
    ws.tensor, ws.last_use, ws.captured = tensor, torch.cuda.current_stream(device).record_event(), False
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
    return _workspace(group, device, nbytes).holds(nbytes)


def _check_group_size(group_size: int, op: str) -> None:
    if group_size < 1:
        raise ValueError(f"{op}: group_size must be >= 1, got {group_size}")


def _group_of(group_name: str, group_size: int, op: str) -> dist.ProcessGroup:
    group = _resolve_process_group(group_name)
    if group.size() != group_size:
        raise ValueError(f"{op}: group_size is {group_size} but group {group_name!r} has {group.size()} ranks")
    return group


def _why_not_fused(group: dist.ProcessGroup, tensors: list[torch.Tensor]) -> str:
    """'' when symmpool serves the call, else why not (the same on every rank)."""
    if not all(t.is_cuda for t in tensors):
        return "CPU tensors"
    if any(t.numel() == 0 for t in tensors):
        return "empty tensors"
    if group.size() == 1:
        return "one rank"
    device = tensors[0].device.index
    backend = symm_backend(group, device)
    if backend is None:
        return "not a symm group"
    if not _C._peer_memory_available(backend, device):
        return "ranks span nodes"
    return ""


def _count(op: str, why_not: str) -> None:
    if why_not:
        _counts[f"{op}.fallback"] += 1
        _counts[f"{op}.fallback: {why_not}"] += 1
    else:
        _counts[f"{op}.fused"] += 1


class _Pipeline:
    """One fused call's streams and workspace around the C++ pipeline: enter
    after the workspace was sized; on exit the copy stream has joined the
    caller's and the workspace records where the caller's stream last used it."""

    def __init__(self, group: dist.ProcessGroup, ws: _Workspace, device: int) -> None:
        self.group, self.ws = group, ws
        self.backend = symm_backend(group, device)
        self.rank, self.world = group.rank(), group.size()
        self.main = torch.cuda.current_stream(device)
        self.copies = ws.copies
        self.capturing = torch.cuda.is_current_stream_capturing()
        ws.captured = ws.captured or self.capturing

    def __enter__(self) -> "_Pipeline":
        # Graph replays are not tracked: replaying a graph with fused ops on
        # one stream while fused ops run on another is the caller's to order.
        if self.ws.last_use is not None and not self.capturing:
            self.main.wait_event(self.ws.last_use)  # the previous op read it, maybe on another stream
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:  # the C++ pipeline joins the copy stream itself when it completes
            self.main.wait_stream(self.copies)
        if not self.capturing:
            self.ws.last_use = self.main.record_event()


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


def _all_gather_matmul_rows(p: _Pipeline, x: torch.Tensor, Bs, shape_out: Callable) -> tuple:
    """A gathered along rows of ``x`` [m, k]: A_flat [world * m, k], each
    rank's rows multiplied by every B as they arrive (one C++ call enqueues
    the pipeline: as Python loops its host time exceeded the GPU's)."""
    A_flat, outs = _C._all_gather_matmul(p.backend, x, list(Bs), 0, p.ws.tensor, p.copies.cuda_stream)
    return shape_out(A_flat), [shape_out(out) for out in outs]


def _all_gather_matmul_columns(p: _Pipeline, x: torch.Tensor, Bs) -> tuple:
    """A gathered along columns of ``x`` [m, k]: A @ B is the sum over ranks
    of shard @ (that rank's rows of B), accumulated as shards arrive."""
    m, k = x.shape
    shards, outs = _C._all_gather_matmul(p.backend, x, list(Bs), 1, p.ws.tensor, p.copies.cuda_stream)
    return shards.permute(1, 0, 2).reshape(m, p.world * k), outs


@torch.library.custom_op(
    "symmpool::fused_all_gather_matmul", mutates_args=(),
    schema="(Tensor A_shard, Tensor[] Bs, int gather_dim, int group_size, str group_name) -> (Tensor, Tensor[])")
def fused_all_gather_matmul(A_shard: torch.Tensor, Bs: list[torch.Tensor], gather_dim: int, group_size: int,
                            group_name: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(all_gather(A_shard, gather_dim), [that @ B for B in Bs])."""
    op = "fused_all_gather_matmul"
    gather_dim = _check_all_gather_matmul(A_shard, Bs, gather_dim, group_size)
    group = _group_of(group_name, group_size, op)
    # From A_shard alone: each rank's Bs are its own (an uneven column split
    # may leave one rank's empty), and a decision that differed between
    # ranks would leave one in a collective the others never enter.
    why_not = _why_not_fused(group, [A_shard])
    ws = None
    if not why_not:
        device = A_shard.device.index
        nbytes = A_shard.numel() * A_shard.element_size()
        ws = _workspace(group, device, nbytes)
        why_not = "" if ws.holds(nbytes) else "workspace not symmetric"
    _count(op, why_not)
    if why_not:
        return _all_gather_matmul_unfused(A_shard, Bs, gather_dim, group)
    with _Pipeline(group, ws, A_shard.device.index) as p:
        if gather_dim == A_shard.dim() - 1:
            lead = A_shard.shape[:-1]
            A, outs = _all_gather_matmul_columns(p, A_shard.reshape(-1, A_shard.shape[-1]), Bs)
            return A.view(*lead, -1), [out.view(*lead, -1) for out in outs]
        x = A_shard.movedim(gather_dim, 0)
        lead = (group_size * x.shape[0], *x.shape[1:-1])

        def shape_out(flat: torch.Tensor) -> torch.Tensor:
            return flat.view(*lead, flat.shape[-1]).movedim(0, gather_dim).contiguous()

        return _all_gather_matmul_rows(p, x.reshape(-1, x.shape[-1]), Bs, shape_out)


@fused_all_gather_matmul.register_fake
def _(A_shard, Bs, gather_dim, group_size, group_name):
    gather_dim = _check_all_gather_matmul(A_shard, Bs, gather_dim, group_size)
    shape = _gathered_shape(A_shard, gather_dim, group_size)
    A = A_shard.new_empty(shape)
    return A, [A_shard.new_empty((*shape[:-1], B.shape[1])) for B in Bs]


# -- matmul, then all-to-all or reduce-scatter --------------------------------------------------------


def _produce_and_all_to_all(p: _Pipeline, A: torch.Tensor, B: torch.Tensor, split: int) -> torch.Tensor:
    """Every rank's chunk for rank ``d`` is rows ``d`` of ``A`` times ``B``
    (``split`` 0) or ``A`` times column block ``d`` of ``B`` (``split`` 1);
    returns this rank's workspace as [world, rows, columns], slot ``s``
    holding rank ``s``'s chunk for us (valid until the pipeline exits). Each
    chunk for a peer is made in a staging buffer and pushed into the peer's
    slot by the copy engines while the next one is made; ours goes last,
    straight into our slot. One C++ call enqueues it all."""
    return _C._produce_and_all_to_all(p.backend, A, B, split, p.ws.tensor, p.copies.cuda_stream)


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


@torch.library.custom_op(
    "symmpool::fused_matmul_reduce_scatter", mutates_args=(),
    schema="(Tensor A, Tensor B, str reduce_op, int scatter_dim, int group_size, str group_name) -> Tensor")
def fused_matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,
                                group_size: int, group_name: str) -> torch.Tensor:
    """reduce_scatter(A @ B, reduce_op, scatter_dim) over the group."""
    op = "fused_matmul_reduce_scatter"
    scatter_dim = _check_reduce_scatter(A, B, reduce_op, scatter_dim, group_size)
    group = _group_of(group_name, group_size, op)
    shape = _reduce_scatter_shape(A, B, scatter_dim, group_size)
    chunk_numel = 1
    for s in shape:
        chunk_numel *= s
    why_not = _why_not_fused(group, [A, B])
    ws = None
    if not why_not:
        nbytes = group_size * chunk_numel * A.element_size()
        ws = _workspace(group, A.device.index, nbytes)
        why_not = "" if ws.holds(nbytes) else "workspace not symmetric"
    _count(op, why_not)
    if why_not:
        return _matmul_reduce_scatter_unfused(A, B, reduce_op, scatter_dim, group)
    reduce = torch.sum if reduce_op == "sum" else torch.mean
    with _Pipeline(group, ws, A.device.index) as p:
        if scatter_dim == A.dim() - 1:  # each rank owns a block of B's columns
            stacked = _produce_and_all_to_all(p, A.reshape(-1, A.shape[-1]), B, 1)
            return reduce(stacked, dim=0).view(shape)
        x = A.movedim(scatter_dim, 0)
        stacked = _produce_and_all_to_all(p, x.reshape(-1, x.shape[-1]), B, 0)
        flat = reduce(stacked, dim=0)
        moved = [shape[scatter_dim], *(s for i, s in enumerate(shape) if i != scatter_dim)]
        return flat.view(moved).movedim(0, scatter_dim).contiguous()


@fused_matmul_reduce_scatter.register_fake
def _(A, B, reduce_op, scatter_dim, group_size, group_name):
    scatter_dim = _check_reduce_scatter(A, B, reduce_op, scatter_dim, group_size)
    return A.new_empty(_reduce_scatter_shape(A, B, scatter_dim, group_size))


def _check_all_to_all(A, B, group_size: int) -> None:
    op = "pipelined_produce_and_all_to_all"
    _check_group_size(group_size, op)
    _check_matmul(A, B, op)
    if A.dim() != 2 or A.shape[0] % group_size:
        raise ValueError(f"{op}: A must be a matrix whose rows ({A.shape[0] if A.dim() else 0}) divide by the "
                         f"group size {group_size}, got {tuple(A.shape)}")


@torch.library.custom_op(
    "symmpool::pipelined_produce_and_all_to_all", mutates_args=(),
    schema="(Tensor A, Tensor B, int group_size, str group_name) -> Tensor")
def pipelined_produce_and_all_to_all(A: torch.Tensor, B: torch.Tensor, group_size: int,
                                     group_name: str) -> torch.Tensor:
    """all_to_all_single(A @ B) with equal chunks along dim 0: rows chunk
    ``s`` of the result is rank ``s``'s product's chunk for this rank."""
    op = "pipelined_produce_and_all_to_all"
    _check_all_to_all(A, B, group_size)
    group = _group_of(group_name, group_size, op)
    n = B.shape[1]
    why_not = _why_not_fused(group, [A, B])
    ws = None
    if not why_not:
        nbytes = A.shape[0] * n * A.element_size()
        ws = _workspace(group, A.device.index, nbytes)
        why_not = "" if ws.holds(nbytes) else "workspace not symmetric"
    _count(op, why_not)
    if why_not:
        out = A.new_empty(A.shape[0], n)
        dist.all_to_all_single(out, (A @ B).contiguous(), group=group)
        return out
    with _Pipeline(group, ws, A.device.index) as p:
        stacked = _produce_and_all_to_all(p, A, B, 0)
        return stacked.reshape(A.shape[0], n).clone()


@pipelined_produce_and_all_to_all.register_fake
def _(A, B, group_size, group_name):
    _check_all_to_all(A, B, group_size)
    return A.new_empty(A.shape[0], B.shape[1])
