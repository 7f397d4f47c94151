"""The problems the TP benchmark times: Llama-3 layers split over the ranks as
tensor parallelism splits them, their tensor shapes, and how much memory one
(op, model, M) needs per rank with every peer set up. Pure: no torch.

* all_gather_matmul: the column-parallel input projection. Each rank holds a
  shard of the activations, A_shard [M/W, hidden], and its columns of the
  weight, B [hidden, mlp/W]; it needs A = all_gather(A_shard) and A @ B.
* matmul_reduce_scatter: the row-parallel output projection. Each rank holds
  A [M, mlp/W] and B [mlp/W, hidden]; it needs its shard of
  reduce_scatter(A @ B, sum), [M/W, hidden].

Sharded dim 0 (default): the activations are [M, hidden], M = batch x seq.
Sharded dim 1: they are [batch, seq, hidden] with seq = M / batch, sharded
along seq (sequence-parallel activations in batch-first layout, what
torch's async-TP pass hands its fused ops as gather_dim / scatter_dim 1).
"""

from __future__ import annotations

import dataclasses

OPS = ("all_gather_matmul", "matmul_reduce_scatter")
BF16_BYTES = 2


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    hidden: int
    mlp: int


MODELS = {"8b": Model("Llama-3-8B", 4096, 14336), "70b": Model("Llama-3-70B", 8192, 28672)}
DEFAULT_M = (2048, 8192, 32768)


class Unfit(ValueError):
    """This (op, model, M) cannot be split over these ranks: the reason."""


@dataclasses.dataclass(frozen=True)
class Shape:
    op: str
    model: str
    m: int
    world: int
    dim: int  # the sharded dim of the activations (gather_dim / scatter_dim)
    lead: tuple  # leading dims of the whole activation: (M,) or (batch, seq)
    k: int  # the matmul's contraction, per rank
    n: int  # the matmul's output columns, per rank

    @property
    def shard_lead(self) -> tuple:
        lead = list(self.lead)
        lead[self.dim] //= self.world
        return tuple(lead)

    @property
    def a_shard(self) -> tuple:  # all_gather_matmul's input
        return (*self.shard_lead, self.k)

    @property
    def a(self) -> tuple:  # the gathered A; matmul_reduce_scatter's input
        return (*self.lead, self.k)

    @property
    def b(self) -> tuple:
        return (self.k, self.n)

    @property
    def c(self) -> tuple:  # A @ B, before any reduce-scatter
        return (*self.lead, self.n)

    @property
    def out(self) -> tuple:  # matmul_reduce_scatter's result
        return (*self.shard_lead, self.n)

    @property
    def stacked(self) -> tuple:
        """A dim-0 collective's view: the all-gather's output, the
        reduce-scatter's input ([W * first dim of a shard, rest])."""
        shard = self.a_shard if self.op == "all_gather_matmul" else self.out
        return (self.world * shard[0], *shard[1:])

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n

    @property
    def transfer_bytes(self) -> int:
        """The collective's size as nccl-tests counts it: the all-gather's
        output, the reduce-scatter's input."""
        return numel(self.stacked) * BF16_BYTES

    def describe(self) -> dict:
        """The JSON's "shape" of a cell."""
        named = {"a_shard": self.a_shard, "a": self.a, "b": self.b, "c": self.c} \
            if self.op == "all_gather_matmul" else {"a": self.a, "b": self.b, "c": self.c, "out": self.out}
        dim_name = "gather_dim" if self.op == "all_gather_matmul" else "scatter_dim"
        return {**{k: list(v) for k, v in named.items()}, dim_name: self.dim, "world": self.world, "k": self.k,
                "n": self.n, "gflop": self.flops / 1e9, "transfer_bytes": self.transfer_bytes}


def numel(shape: tuple) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def make_shape(op: str, model: str, m: int, world: int, dim: int = 0, batch: int = 1) -> Shape:
    """The per-rank shapes of `op` for `model`'s layer at M tokens over
    `world` ranks, sharded along `dim` (0: [M, hidden]; 1: [batch, M/batch,
    hidden]). Raises Unfit where the split does not come out even."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")
    if dim not in (0, 1):
        raise Unfit(f"sharded dim must be 0 or 1, got {dim}")
    spec = MODELS[model]
    if spec.mlp % world:
        raise Unfit(f"{spec.name}'s MLP width {spec.mlp} does not split over {world} ranks")
    if dim == 0:
        lead = (m,)
    elif m % batch:
        raise Unfit(f"M={m} is not a whole number of sequences of batch {batch}")
    else:
        lead = (batch, m // batch)
    if lead[dim] % world:
        raise Unfit(f"{'M' if dim == 0 else 'seq'}={lead[dim]} (sharded dim {dim}) does not split over {world} ranks")
    k, n = (spec.hidden, spec.mlp // world) if op == "all_gather_matmul" else (spec.mlp // world, spec.hidden)
    return Shape(op, model, m, world, dim, lead, k, n)


def memory_terms(shape: Shape, peers: list[str]) -> dict[str, int]:
    """Bytes per rank one (op, model, M) needs with `peers` set up, by what
    needs them: the shared inputs, the reference results (kept for the
    checks), each peer's own buffers plus two of its per-call outputs (one
    being written while the last one's memory waits for reuse). An estimate:
    the ops' workspaces are counted as torch's are sized, symmpool's fused
    ops as if they allocated what torch's do."""
    s, b = numel(shape.a_shard), numel(shape.b)
    a, c = numel(shape.a), numel(shape.c)
    o, stacked = numel(shape.out), numel(shape.stacked)
    relaid = shape.dim != 0  # the unfused path copies to and from the dim-0 layout
    if shape.op == "all_gather_matmul":
        per_peer = {
            "nccl-unfused": stacked + c + relaid * 2 * a,
            "matmul-alone": a + c,
            "transfer-alone": 2 * stacked,
            "symmpool-fused": 2 * (a + c),
            "torch-fused": 2 * (a + c) + s + relaid * s,  # its workspace holds one shard
        }
        terms = {"inputs": s + b, "reference": stacked + a + c}
    else:
        per_peer = {
            "nccl-unfused": c + o + relaid * stacked,
            "matmul-alone": c,
            "transfer-alone": stacked + 2 * o,
            "symmpool-fused": 2 * (c + o),
            "torch-fused": 2 * (c + o) + 2 * o + relaid * a,  # its workspace holds two output chunks
        }
        terms = {"inputs": a + b, "reference": c + stacked + o}
    terms.update({p: per_peer[p] for p in peers})
    if "nccl-unfused" not in peers:  # it makes the reference whether it is timed or not
        terms["nccl-unfused"] = per_peer["nccl-unfused"]
    return {k: v * BF16_BYTES for k, v in terms.items()}


def fits(estimate: int, available: list[int], fraction: float) -> str | None:
    """Why a shape needing `estimate` bytes per rank is skipped when the
    ranks have `available` bytes, or None when it fits in `fraction` of the
    smallest."""
    if estimate <= fraction * min(available):
        return None
    return (f"needs ~{estimate / 2**30:.1f} GiB per rank, more than {fraction:g} of the "
            f"{min(available) / 2**30:.1f} GiB available")
