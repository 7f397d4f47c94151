"""Between the sharded dim of the activations and the dim-0 layout that
torch.distributed's collectives (and symmpool's) work in. For dim 0 both are
views; for dim 1 they copy, as an unfused model has to."""

from __future__ import annotations

import torch


def gathered(stacked: torch.Tensor, world: int, shard: tuple, dim: int) -> torch.Tensor:
    """The rank shards an all-gather stacked along dim 0 ([W * shard[0],
    ...]), concatenated along `dim` instead: all_gather(shard, dim)."""
    return stacked.view(world, *shard).movedim(0, dim).flatten(dim, dim + 1)


def stage(full: torch.Tensor, world: int, dim: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """`full` cut in `world` chunks along `dim`, the chunks stacked along dim
    0 ([W * chunk[0], ...]): what a dim-0 reduce-scatter takes to give each
    rank its chunk of the sum along `dim`. Written into `out` when given
    (and when a copy is needed at all)."""
    chunks = full.unflatten(dim, (world, full.shape[dim] // world)).movedim(dim, 0)
    if chunks.is_contiguous():
        return chunks.flatten(0, 1)
    if out is None:
        return chunks.contiguous().flatten(0, 1)
    out.view(chunks.shape).copy_(chunks)
    return out
