"""The values the TP benchmark feeds its ops.

Checks: results are compared bit for bit (torch.equal) with NCCL's unfused
result, but matmuls sum in orders that differ between peers and between
cuBLAS kernels (split-K, bf16 reductions), and reduce-scatters sum ranks in
orders of their own. So every sum must be exact in bf16, whatever its order:
A holds random integers in [-v, v] and B is zero but for a few random rows of
random integers in [-v, v], so that a dot product, summed over the ranks a
reduce-scatter adds, stays an integer of magnitude at most 256 (bf16 holds
every such integer). In the products every row of A counts (and the columns
B picks); the gathered A of an all-gather is compared whole.

Timing: normal random values, the same for every peer, as real activations
and weights (a GEMM on small integers or zeros draws less power, and may run
faster than on real data)."""

from __future__ import annotations

import zlib

import torch

EXACT_BF16 = 256  # every integer up to this magnitude is a bf16


def check_ranges(terms: int) -> tuple[int, int]:
    """(v, rows): values in [-v, v] and `rows` nonzero rows of B per rank
    such that terms * rows * v * v <= 256, with the widest values that leave
    at least one row. `terms`: how many ranks' dot products a result adds (1
    for an all-gather + matmul, the world size for a matmul + reduce-scatter)."""
    for v in (4, 2, 1):
        rows = EXACT_BF16 // (terms * v * v)
        if rows:
            return v, rows
    raise ValueError(f"no exact bf16 check data for sums over {terms} ranks (at most {EXACT_BF16})")


def generator(device, seed: int, rank: int, key: str) -> torch.Generator:
    """Different on every rank and for every (op, shape), the same in every run."""
    gen = torch.Generator(device=device)
    gen.manual_seed(zlib.crc32(f"{seed}/{rank}/{key}".encode()))
    return gen


def fill_check(a: torch.Tensor, b: torch.Tensor, terms: int, gen: torch.Generator) -> None:
    """Exact check data into the activation `a` and the weight `b` (see the
    module's comment)."""
    v, rows = check_ranges(terms)
    a.random_(-v, v + 1, generator=gen)
    b.zero_()
    picked = torch.randperm(b.shape[0], generator=gen, device=b.device)[:rows]
    values = torch.empty((picked.numel(), b.shape[1]), dtype=b.dtype, device=b.device)
    b.index_copy_(0, picked, values.random_(-v, v + 1, generator=gen))


def fill_timing(tensors, gen: torch.Generator) -> None:
    for t in tensors:
        t.normal_(generator=gen)
