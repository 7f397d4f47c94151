"""The peers the benchmark times, each on its own buffers: how each one is set
up and how it runs one call of an op at one size.

* symmpool: a "symm" group made while SYMMPOOL_COLLECTIVES=always, buffers
  from its backend's allocate_tensor. Its variants run the same calls on the
  same buffers through more "symm" groups, each made while
  SYMMPOOL_ALL_REDUCE_ALGORITHM / SYMMPOOL_REDUCE_SCATTER_ALGORITHM (and
  SYMMPOOL_TWO_STEP_PIECE_BYTES) name another algorithm (SymmBackend reads
  them when it is constructed): the table's choice beside the others.
* nccl: a plain "nccl" group (the reference), torch.empty buffers.
* nccl-registered: a plain "nccl" group of its own, buffers from a
  torch.cuda.MemPool over symmpool's allocator (symmpool.mem_pool()),
  registered once with that group's communicator after they exist:
  ProcessGroupNCCL.register_mem_pool(pool, symm=False), which walks the
  pool's segments (CUDACachingAllocator::snapshot) and ncclCommRegisters
  each; torch checks no allocator on CUDA, so symmpool's segments are taken.
* nccl-window: NCCL's symmetric windows, reached as torch 2.11 reaches them:
  a plain "nccl" group of its own, buffers from a torch.cuda.MemPool over
  symmpool's allocator (cuMem memory, which a window needs), registered once
  after they exist with register_mem_pool(pool, symm=True):
  ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC) per segment, a
  collective call, after which NCCL 2.27+ may run its symmetric kernels.
  (Not NCCL's own allocator, backend.mem_allocator: torch 2.11 offers it only
  on devices that support multicast; nor torch's set_backend("NCCL") +
  symm_mem.empty: that backend is process-wide, and torch-symm-mem keeps its own.)
  Each registered group's communicator is made first (one all-reduce):
  registering raises without it. Every NCCL peer thus runs on a plain
  "nccl" group, each on its own, so a communicator knows only its peer's
  buffers; a peer whose setup raises is recorded as failed.
* torch-symm-mem: torch.distributed._symmetric_memory buffers
  (symm_mem.empty + rendezvous on the nccl group), one variant per torch op
  (no multimem_* op: NVLink multicast stays off).
* peer-copy: the bytes a rank receives in an all-gather, pulled from the
  peers' torch symm_mem buffers with torch's copy_ (cudaMemcpyAsync, a
  copy engine), no synchronization: what the links give. Its variants pull
  the same bytes with an elementwise kernel on every SM ("sm") and half
  each way at once ("copy-engine+sm").

Buffers are two flat bf16 tensors per peer (`a`, `b`) of the largest size;
every size uses their leading elements.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import torch
import torch.distributed as dist

OPS = ("all_gather", "reduce_scatter", "all_reduce")
PEER_COPY = "peer_copy"  # the op name of the peer-copy reference
PEERS = ("symmpool", "nccl", "nccl-registered", "nccl-window", "torch-symm-mem", "peer-copy")
# How each NCCL peer's buffers are made and registered (the results' context).
NCCL_PEERS = {
    "nccl": "plain \"nccl\" group (the reference; torch-symm-mem rendezvous on it), torch.empty buffers, "
            "not registered",
    "nccl-registered": "its own plain \"nccl\" group; buffers from torch.cuda.MemPool over symmpool's allocator "
                       "(symmpool.mem_pool()), registered once after they exist and after an all-reduce made "
                       "the communicator: ProcessGroupNCCL.register_mem_pool(pool, symm=False) (ncclCommRegister "
                       "per segment)",
    "nccl-window": "its own plain \"nccl\" group; buffers from torch.cuda.MemPool over symmpool's allocator "
                   "(symmpool.mem_pool(), cuMem memory), registered once after they exist and after an all-reduce "
                   "made the communicator: ProcessGroupNCCL.register_mem_pool(pool, symm=True) "
                   "(ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC: NCCL 2.27+ symmetric kernels)",
}
DTYPE = torch.bfloat16

# torch.ops.symm_mem ops per op (torch 2.11: torch/distributed/_symmetric_memory/__init__.py
# defines the _low_contention_* ones, libtorch_cuda's CUDASymmetricMemoryOps.cu the others).
TORCH_SYMM_MEM_OPS = {
    "all_gather": ("_low_contention_all_gather",),
    "reduce_scatter": ("_low_contention_reduce_scatter", "reduce_scatter_out"),
    "all_reduce": ("one_shot_all_reduce_out", "two_shot_all_reduce_"),
}


def input_numel(op: str, nbytes: int, world: int) -> int:
    """Elements of one rank's input: `nbytes` is the all-gather output, the
    reduce-scatter input, the all-reduce buffer."""
    numel = nbytes // DTYPE.itemsize
    return numel // world if op in ("all_gather", PEER_COPY) else numel


def output_numel(op: str, nbytes: int, world: int) -> int:
    numel = nbytes // DTYPE.itemsize
    return numel // world if op == "reduce_scatter" else numel


@dataclasses.dataclass
class Buffers:
    a: torch.Tensor  # inputs
    b: torch.Tensor  # outputs of out-of-place calls

    @classmethod
    def make(cls, empty: Callable[[int], torch.Tensor], nbytes: int) -> "Buffers":
        return cls(empty(nbytes // DTYPE.itemsize), empty(nbytes // DTYPE.itemsize))

    def views(self, op: str, nbytes: int, world: int, in_place: bool) -> tuple[torch.Tensor, torch.Tensor]:
        inp = self.a[:input_numel(op, nbytes, world)]
        return inp, (inp if in_place else self.b[:output_numel(op, nbytes, world)])


@dataclasses.dataclass
class Call:
    """One op at one size on one peer: run() enqueues it on the current
    stream and returns the tensor holding its result."""
    inp: torch.Tensor
    run: Callable[[], torch.Tensor]
    poison: torch.Tensor | None = None  # filled with NaN before the check; None: in place or made by the op
    compared: Callable[[torch.Tensor], torch.Tensor] = lambda t: t  # the part of a result the check compares


# symmpool's variants: (name, op, the environment its group is made with).
SYMMPOOL_TWO_STEP = "two-step"
# The algorithms SYMMPOOL_ALL_REDUCE_ALGORITHM names (collective_types.hpp's to_string).
ALL_REDUCE_ALGORITHMS = ("low-latency", "one-shot", "two-shot", SYMMPOOL_TWO_STEP)


def symmpool_variants(two_step_pieces: list[int], all_reduce_algorithms: list[str] = ()) -> list[tuple[str, str, dict]]:
    """The two-step reduce-scatter and all-reduce, one variant per piece
    size; an all-reduce variant per algorithm named (the table's losers, timed
    beside its choice)."""
    out = [(a, "all_reduce", {"SYMMPOOL_ALL_REDUCE_ALGORITHM": a}) for a in all_reduce_algorithms]
    for piece in two_step_pieces:
        name = f"{SYMMPOOL_TWO_STEP} {piece >> 20}M" if piece % (1 << 20) == 0 else f"{SYMMPOOL_TWO_STEP} {piece}B"
        env = {"SYMMPOOL_TWO_STEP_PIECE_BYTES": str(piece)}
        out.append((name, "reduce_scatter", {**env, "SYMMPOOL_REDUCE_SCATTER_ALGORITHM": SYMMPOOL_TWO_STEP}))
        out.append((name, "all_reduce", {**env, "SYMMPOOL_ALL_REDUCE_ALGORITHM": SYMMPOOL_TWO_STEP}))
    return out


# The all-gather as FSDP2 calls it: this rank's input is its own slice of the
# output (no copy within the GPU), on the peer's own group and buffers.
ALL_GATHER_IN_PLACE = "in-place"
# symmpool's functional all-reduce on the same group: torch.ops.symmpool.all_reduce,
# a C++ op without torch.distributed's Python wrapper (out of place, into a
# new tensor in plain memory), timed where the table's low-latency
# all-reduce, which takes any memory, runs it: up to 128 KiB at 2 ranks (at
# other world sizes the table has no low-latency entry and the op's plain
# output goes to NCCL, so the variant is not made there).
SYMMPOOL_OP = "torch.ops.symmpool"
SYMMPOOL_OP_MAX_BYTES = 128 << 10
# Its in-place form, torch.ops.symmpool.all_reduce_, on the peer's own
# (symmetric) buffer: at every size, as torch's two_shot_all_reduce_ is timed.
SYMMPOOL_OP_IN_PLACE = "torch.ops.symmpool in place"


class C10dPeer:
    """torch.distributed's collectives on one group (symmpool and the NCCL peers);
    `variant_groups` {(variant, op): group} run the same calls through other groups;
    given `rank`, the all-gather also runs in place (ALL_GATHER_IN_PLACE);
    `registration` (backend, pool): the pool its buffers came from, registered
    with its group's communicator (deregister() gives it back)."""

    def __init__(self, name: str, group, buffers: Buffers, world: int, variant_groups: dict | None = None,
                 rank: int | None = None, functional_op: bool = False, registration: tuple | None = None):
        self.name, self.group, self.buffers, self.world, self.rank = name, group, buffers, world, rank
        self.variant_groups = variant_groups or {}
        self.functional_op = functional_op  # SYMMPOOL_OP for all-reduces
        self.registration = registration

    def variants(self, op: str) -> list:
        if op not in OPS:
            return []
        in_place = [ALL_GATHER_IN_PLACE] if op == "all_gather" and self.rank is not None else []
        functional = [SYMMPOOL_OP, SYMMPOOL_OP_IN_PLACE] if op == "all_reduce" and self.functional_op else []
        return [None] + in_place + functional + [v for v, o in self.variant_groups if o == op]

    def call(self, op: str, variant, nbytes: int) -> Call:
        if variant in (SYMMPOOL_OP, SYMMPOOL_OP_IN_PLACE):
            if op != "all_reduce" or not self.functional_op:
                raise ValueError(f"{self.name}: {variant} is an all-reduce variant of a peer made with it")
            inp, _ = self.buffers.views(op, nbytes, self.world, in_place=True)
            group_name = self.group.group_name

            def run_op():  # a new tensor each call
                return torch.ops.symmpool.all_reduce(inp, "sum", group_name)

            def run_in_place():
                torch.ops.symmpool.all_reduce_(inp, "sum", group_name)
                return inp
            return Call(inp, run_op if variant == SYMMPOOL_OP else run_in_place, poison=None)
        if variant == ALL_GATHER_IN_PLACE:
            if op != "all_gather" or self.rank is None:
                raise ValueError(f"{self.name}: {ALL_GATHER_IN_PLACE} is an all-gather variant given a rank")
            _, out = self.buffers.views(op, nbytes, self.world, in_place=False)
            chunk = input_numel(op, nbytes, self.world)
            inp = out[self.rank * chunk:(self.rank + 1) * chunk]
            g = self.group
        else:
            inp, out = self.buffers.views(op, nbytes, self.world, in_place=op == "all_reduce")
            g = self.group if variant is None else self.variant_groups[(variant, op)]
        if op == "all_gather":
            def run():
                dist.all_gather_into_tensor(out, inp, group=g)
                return out
        elif op == "reduce_scatter":
            def run():
                dist.reduce_scatter_tensor(out, inp, group=g)
                return out
        else:
            def run():
                dist.all_reduce(out, group=g)
                return out
        return Call(inp, run, poison=None if out is inp else out)


class TorchSymmMemPeer:
    """torch.ops.symm_mem on symm_mem.empty buffers rendezvoused on `group`."""
    name = "torch-symm-mem"

    def __init__(self, group, buffers: Buffers, world: int):
        self.group_name, self.buffers, self.world = group.group_name, buffers, world

    def variants(self, op: str) -> list:
        return list(TORCH_SYMM_MEM_OPS.get(op, ()))

    @staticmethod
    def missing(variant: str) -> str | None:
        """Why this torch cannot run `variant`, or None."""
        import torch.distributed._symmetric_memory  # noqa: F401  (defines the _low_contention_* ops)

        return None if hasattr(torch.ops.symm_mem, variant) else f"torch.ops.symm_mem.{variant} not in this torch"

    def call(self, op: str, variant: str, nbytes: int) -> Call:
        ops, name = torch.ops.symm_mem, self.group_name
        in_place = variant == "two_shot_all_reduce_"
        inp, out = self.buffers.views(op, nbytes, self.world, in_place)
        if variant in ("_low_contention_all_gather", "_low_contention_reduce_scatter"):
            # They copy on a side stream and register a Work for the result:
            # wait_tensor makes the current stream wait for it, so the
            # events (and a graph capture) see the whole op.
            args = (inp, name) if variant == "_low_contention_all_gather" else (inp, "sum", name)
            op_fn = getattr(ops, variant)

            def run():
                return torch.ops._c10d_functional.wait_tensor(op_fn(*args))
            return Call(inp, run)
        if variant == "reduce_scatter_out":
            def run():
                return ops.reduce_scatter_out(inp, name, False, out)
        elif variant == "one_shot_all_reduce_out":
            def run():
                return ops.one_shot_all_reduce_out(inp, "sum", name, out)
        elif variant == "two_shot_all_reduce_":
            def run():
                return ops.two_shot_all_reduce_(inp, "sum", name)
        else:
            raise ValueError(f"unknown torch-symm-mem variant {variant!r} for {op}")
        return Call(inp, run, poison=None if in_place else out)


# The peer copy's variants: how the pull runs. None: torch's copy_, a
# cudaMemcpyAsync on the copy engines. "sm": an elementwise kernel on every
# SM (torch.mul by 1, exact in bf16, -0 and NaN included) reading the peer's
# memory. "copy-engine+sm": half of each peer's chunk each way at once, the
# copy on a side stream: whether the links give more than either alone.
PEER_COPY_SM = "sm"
PEER_COPY_BOTH = "copy-engine+sm"


class PeerCopyPeer:
    """Pulls, from every other rank's torch symm_mem buffer, the chunk it
    would receive in an all-gather of this size, into its own output."""
    name = "peer-copy"

    def __init__(self, handle, buffers: Buffers, rank: int, world: int):
        self.handle, self.buffers, self.rank, self.world = handle, buffers, rank, world
        self.side = None  # the copy engines' stream of the "copy-engine+sm" variant, made on first use

    def variants(self, op: str) -> list:
        return [None, PEER_COPY_SM, PEER_COPY_BOTH] if op == PEER_COPY else []

    def call(self, op: str, variant, nbytes: int) -> Call:
        if variant not in (None, PEER_COPY_SM, PEER_COPY_BOTH):
            raise ValueError(f"unknown peer-copy variant {variant!r}")
        inp, out = self.buffers.views(PEER_COPY, nbytes, self.world, in_place=False)
        chunk = inp.numel()
        peers = [p for p in range(self.world) if p != self.rank]
        # get_buffer(peer, sizes, dtype, storage_offset): the peer's `a` (its input) mapped here.
        pulls = [(out[p * chunk:(p + 1) * chunk], self.handle.get_buffer(p, (chunk,), DTYPE, 0)) for p in peers]
        if variant == PEER_COPY_BOTH:
            half = chunk // 2
            by_copy = [(dst[:half], src[:half]) for dst, src in pulls]
            by_sm = [(dst[half:], src[half:]) for dst, src in pulls]
            if self.side is None and out.is_cuda:
                self.side = torch.cuda.Stream(device=out.device)
            side = self.side

            def run():
                if side is not None:
                    side.wait_stream(torch.cuda.current_stream(out.device))
                with torch.cuda.stream(side):  # None (no GPU, the unit tests): the current stream
                    for dst, src in by_copy:
                        dst.copy_(src)
                for dst, src in by_sm:
                    torch.mul(src, 1, out=dst)
                if side is not None:
                    torch.cuda.current_stream(out.device).wait_stream(side)
                return out
        elif variant == PEER_COPY_SM:
            def run():
                for dst, src in pulls:
                    torch.mul(src, 1, out=dst)
                return out
        else:
            def run():
                for dst, src in pulls:
                    dst.copy_(src)
                return out

        def compared(t):  # this rank's own chunk is not copied
            return torch.cat([t[p * chunk:(p + 1) * chunk] for p in peers])
        return Call(inp, run, poison=out, compared=compared)


def _symm_group_with(symm_backend_name: str, env: dict):
    """A "symm" group made while `env` is set (its backend reads it then)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return dist.new_group(backend=symm_backend_name)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _nccl_group(device):
    """A plain "nccl" group whose communicator exists: register_mem_pool
    raises without one (ProcessGroupNCCL::registerMemPool)."""
    group = dist.new_group(backend="nccl")
    dist.all_reduce(torch.zeros(1, device=device), group=group)
    return group


def _registered_peer(name: str, make_pool, symm: bool, device, world: int, rank: int, nbytes: int) -> C10dPeer:
    """A peer on its own plain "nccl" group whose buffers come from
    `make_pool(backend, device)`, registered once after they exist (with
    symm, a collective call: every rank makes it here)."""
    group = _nccl_group(device)
    backend = group._get_backend(device)
    pool = make_pool(backend, device)
    with torch.cuda.use_mem_pool(pool, device):
        buffers = Buffers.make(lambda n: torch.empty(n, dtype=DTYPE, device=device), nbytes)
    backend.register_mem_pool(pool, symm=symm)
    return C10dPeer(name, group, buffers, world, rank=rank, registration=(backend, pool))


def _symmpool_pool(backend, device):
    import symmpool

    return symmpool.mem_pool()


def make_peers(names, symm_backend_name: str, device, world: int, rank: int, nbytes: int,
               two_step_pieces: list[int] = (), all_reduce_algorithms: list[str] = ()) -> tuple[dict, dict]:
    """The groups and buffers of every peer in `names` (nccl always: it is
    the reference), made in the same order on every rank; symmpool with a
    two-step variant per piece size and one per all-reduce algorithm named.
    Returns ({name: peer}, {name: reason}) for peers whose setup failed."""
    peers, failed = {}, {}
    nccl = dist.new_group(backend="nccl")
    peers["nccl"] = C10dPeer("nccl", nccl, Buffers.make(
        lambda n: torch.empty(n, dtype=DTYPE, device=device), nbytes), world, rank=rank)

    if "symmpool" in names:
        os.environ["SYMMPOOL_COLLECTIVES"] = "always"
        symm = dist.new_group(backend=symm_backend_name)
        backend = symm._get_backend(device)
        symm_buffers = Buffers.make(lambda n: backend.allocate_tensor(n, dtype=DTYPE, device=device), nbytes)
        variant_groups = {(v, op): _symm_group_with(symm_backend_name, env)
                          for v, op, env in symmpool_variants(list(two_step_pieces),
                                                              list(all_reduce_algorithms))}
        peers["symmpool"] = C10dPeer("symmpool", symm, symm_buffers, world, variant_groups, rank=rank,
                                     functional_op=world == 2)

    for name, make_pool, symm in (("nccl-registered", _symmpool_pool, False), ("nccl-window", _symmpool_pool, True)):
        if name in names:
            try:
                peers[name] = _registered_peer(name, make_pool, symm, device, world, rank, nbytes)
            except Exception as e:  # noqa: BLE001  (recorded, the other peers still run)
                failed[name] = f"setup: {type(e).__name__}: {e}"

    if "torch-symm-mem" in names or "peer-copy" in names:
        try:
            import torch.distributed._symmetric_memory as symm_mem

            # symm_mem.empty draws on a caching MemPool: buffers of 16 MiB and
            # more in whole 2 MiB pages get a segment each, so each starts its
            # allocation (offset 0), where get_buffer(peer, ..., 0) points.
            symm_bytes = max(16 << 20, -(-nbytes // (2 << 20)) * (2 << 20))
            buffers = Buffers.make(lambda n: symm_mem.empty(n, dtype=DTYPE, device=device), symm_bytes)
            handle = symm_mem.rendezvous(buffers.a, nccl)  # collective: every rank makes it here
            symm_mem.rendezvous(buffers.b, nccl)
            peers["torch-symm-mem"] = TorchSymmMemPeer(nccl, buffers, world)
            if world > 1:
                peers["peer-copy"] = PeerCopyPeer(handle, buffers, rank, world)
            else:
                failed["peer-copy"] = "needs 2 or more ranks: one rank has no peer to copy from"
        except Exception as e:  # noqa: BLE001  (recorded, the other peers still run)
            failed["torch-symm-mem"] = failed["peer-copy"] = f"setup: {type(e).__name__}: {e}"
    return {n: p for n, p in peers.items() if n in names or n == "nccl"}, failed


def deregister(peers: dict, failed: dict) -> None:
    """Gives back every registered pool, in make_peers' order on every rank
    (a window's deregistration is collective), skipping peers that failed on
    some rank (their registrations may not match)."""
    for name, peer in peers.items():
        if name not in failed and getattr(peer, "registration", None):
            backend, pool = peer.registration
            backend.deregister_mem_pool(pool)
