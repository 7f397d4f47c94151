"""The peers the TP benchmark times, and how each runs one call of an op on
one shape.

* symmpool-fused: torch.ops.symmpool.fused_all_gather_matmul /
  fused_matmul_reduce_scatter on a "symm" group.
* nccl-unfused: the collective on a plain NCCL group, then (or before) the
  matmul, as a model without fusion runs them.
* torch-fused: torch.ops.symm_mem's fused ops (PyTorch's async TP) on that
  NCCL group.
* matmul-alone: only the matmul, on the whole A: what a fused op would take
  if its transfer hid entirely behind it.
* transfer-alone: only the collective, on symmpool (torch.ops.symmpool.
  all_gather / reduce_scatter): which of the two is longer.

Every peer reads the same input tensors, allocated from symmpool's memory
(so that symmpool's ops may run on symmpool); symmpool's ops also run under
that pool, so what they allocate (their outputs) is symmetric too. A peer's
run() returns its results by name; the check compares each with the
reference result of that name (nccl-unfused's, which returns them all).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import torch
import torch.distributed as dist

import layout
from shapes import Shape

PEERS = ("symmpool-fused", "nccl-unfused", "torch-fused", "matmul-alone", "transfer-alone")
REFERENCE = "nccl-unfused"
SYMMPOOL_PEERS = ("symmpool-fused", "transfer-alone")  # they need the "symm" group and symmpool's pool
DTYPE = torch.bfloat16


@dataclasses.dataclass
class Groups:
    """What the peers run on, set up once per run."""
    world: int
    nccl: object  # a ProcessGroup with an NCCL backend
    symm_name: str | None = None  # the "symm" group's name; None when symmpool is not there
    # symmpool.peer_memory_counts: symmpool-fused's first call (its check)
    # must have fused, or its times would be the unfused fallback's.
    fused_counts: Callable[[], dict] | None = None


@dataclasses.dataclass
class Inputs:
    """The tensors every peer reads for one shape: (A_shard, B) for
    all_gather_matmul, (A, B) for matmul_reduce_scatter."""
    a: torch.Tensor
    b: torch.Tensor


@dataclasses.dataclass
class Call:
    run: Callable[[], dict]  # enqueues one call on the current stream: its results by name
    poison: tuple = ()  # outputs it writes into, NaN before the check
    inputs: dict = dataclasses.field(default_factory=dict)  # its own inputs, filled from the reference's


def with_group_size(op, head: tuple, world: int, group_name: str) -> tuple:
    """`head`, the group size where the op's schema takes an int next (as
    _c10d_functional's collectives do, and symmpool's are about to), then the
    group name."""
    args = op.default._schema.arguments
    takes_size = len(args) > len(head) and isinstance(args[len(head)].type, torch._C.IntType)
    return (*head, *((world,) if takes_size else ()), group_name)


def make_call(peer: str, shape: Shape, inputs: Inputs, groups: Groups, pool=None) -> Call:
    """One call of `shape.op` on `peer`; raises where the peer lacks it.
    `pool`: symmpool's MemPool, under which symmpool's ops run."""
    if peer not in _BUILDERS:
        raise ValueError(f"unknown peer {peer!r}; known: {', '.join(PEERS)}")
    if peer in SYMMPOOL_PEERS and groups.symm_name is None:
        raise RuntimeError("no symm group (symmpool did not set up)")
    return _BUILDERS[peer](shape, inputs, groups, pool)


def _empty(shape: tuple, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=DTYPE, device=like.device)


def _nccl_unfused(shape: Shape, inputs: Inputs, groups: Groups, pool) -> Call:
    group, world = groups.nccl, groups.world
    if shape.op == "all_gather_matmul":
        stacked, c = _empty(shape.stacked, inputs.a), _empty(shape.c, inputs.a)

        def run():
            dist.all_gather_into_tensor(stacked, inputs.a, group=group)
            a = layout.gathered(stacked, world, shape.a_shard, shape.dim)
            torch.matmul(a, inputs.b, out=c)
            return {"stacked": stacked, "a": a, "c": c}
        return Call(run, poison=(stacked, c))
    c, out = _empty(shape.c, inputs.a), _empty(shape.out, inputs.a)
    stage_buf = _empty(shape.stacked, inputs.a) if shape.dim != 0 else None

    def run():
        torch.matmul(inputs.a, inputs.b, out=c)
        stacked = layout.stage(c, world, shape.dim, out=stage_buf)
        dist.reduce_scatter_tensor(out, stacked, group=group)
        return {"c": c, "stacked": stacked, "out": out}
    return Call(run, poison=tuple(t for t in (c, out, stage_buf) if t is not None))


def _matmul_alone(shape: Shape, inputs: Inputs, groups: Groups, pool) -> Call:
    """The whole A @ B; all_gather_matmul's whole A is its own input."""
    ag = shape.op == "all_gather_matmul"
    a = _empty(shape.a, inputs.a) if ag else inputs.a
    c = _empty(shape.c, inputs.a)

    def run():
        torch.matmul(a, inputs.b, out=c)
        return {"c": c}
    return Call(run, poison=(c,), inputs={"a": a} if ag else {})


def _torch_fused(shape: Shape, inputs: Inputs, groups: Groups, pool) -> Call:
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem's fused ops)

    name = groups.nccl.group_name
    if shape.op == "all_gather_matmul":
        op = torch.ops.symm_mem.fused_all_gather_matmul

        def run():
            a, cs = op(inputs.a, [inputs.b], shape.dim, name)
            return {"a": a, "c": cs[0]}
    else:
        op = torch.ops.symm_mem.fused_matmul_reduce_scatter

        def run():
            return {"out": op(inputs.a, inputs.b, "sum", shape.dim, name)}
    return Call(run)


def _under(pool) -> Callable[[], contextlib.AbstractContextManager]:
    return (lambda: torch.cuda.use_mem_pool(pool)) if pool is not None else contextlib.nullcontext


def _symmpool_fused(shape: Shape, inputs: Inputs, groups: Groups, pool) -> Call:
    under = _under(pool)
    if shape.op == "all_gather_matmul":
        name, op = "fused_all_gather_matmul", torch.ops.symmpool.fused_all_gather_matmul
        args = with_group_size(op, (inputs.a, [inputs.b], shape.dim), groups.world, groups.symm_name)

        def run():
            with under():
                a, cs = op(*args)
            return {"a": a, "c": cs[0] if isinstance(cs, (list, tuple)) else cs}
    else:
        name, op = "fused_matmul_reduce_scatter", torch.ops.symmpool.fused_matmul_reduce_scatter
        args = with_group_size(op, (inputs.a, inputs.b, "sum", shape.dim), groups.world, groups.symm_name)

        def run():
            with under():
                return {"out": op(*args)}
    return Call(_first_call_fused(run, name, groups.fused_counts))


def _first_call_fused(run: Callable[[], dict], op: str, counts: Callable[[], dict] | None) -> Callable[[], dict]:
    """run, whose first call (the check) raises unless symmpool fused it:
    where it falls back (one rank, ranks span nodes...) the cell is
    unavailable with the reason, instead of timing the unfused ops under the
    fused peer's name. Later calls (timed) run as they are."""
    if counts is None:
        return run
    first = True

    def checked() -> dict:
        nonlocal first
        if not first:
            return run()
        first = False
        before = counts()
        out = run()
        after = counts()
        if after.get(f"{op}.fused", 0) > before.get(f"{op}.fused", 0):
            return out
        prefix = f"{op}.fallback: "
        why = [k[len(prefix):] for k in after if k.startswith(prefix) and after[k] > before.get(k, 0)]
        raise RuntimeError(f"symmpool ran it unfused ({', '.join(why) or 'no fused call counted'})")
    return checked


def _symmpool_transfer(shape: Shape, inputs: Inputs, groups: Groups, pool) -> Call:
    """symmpool's collective alone, on the bytes of the fused op's."""
    under = _under(pool)
    if shape.op == "all_gather_matmul":
        op, own, name = torch.ops.symmpool.all_gather, {}, "stacked"
        args = with_group_size(op, (inputs.a,), groups.world, groups.symm_name)
    else:
        with under():  # its input must be symmetric too
            own = {"stacked": _empty(shape.stacked, inputs.a)}
        op, name = torch.ops.symmpool.reduce_scatter, "out"
        args = with_group_size(op, (own["stacked"], "sum"), groups.world, groups.symm_name)

    def run():
        with under():
            return {name: op(*args)}
    return Call(run, inputs=own)


_BUILDERS = {"symmpool-fused": _symmpool_fused, "nccl-unfused": _nccl_unfused, "torch-fused": _torch_fused,
             "matmul-alone": _matmul_alone, "transfer-alone": _symmpool_transfer}


def enable_torch_symm_mem(group_name: str) -> str | None:
    """Registers the group with torch's symmetric memory, as older torch
    versions need (newer ones find the group on first use and deprecate this
    call). Returns why it failed, or None: not fatal, the ops may still find
    the group themselves."""
    import warnings

    import torch.distributed._symmetric_memory as symm_mem

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(group_name)
        return None
    except Exception as e:  # noqa: BLE001  (recorded in the context)
        return f"{type(e).__name__}: {e}"
