"""Helpers the multi-GPU test bodies share."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_group(rank: int, world: int, backend: str, **kwargs):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(backend, rank=rank, world_size=world, device_id=device, **kwargs)
    return device


def poisoned(backend, n: int, dtype, device):
    t = backend.allocate_tensor(n, dtype=dtype, device=device)
    t.fill_(float("nan"))
    return t


# SYMMPOOL_COLLECTIVES for a test's `collectives` mode: "table" is the default (unset).
def expect_error(kind, texts, call, what: str) -> None:
    """`call()` raises `kind` whose message holds `texts` (a string or several);
    else AssertionError(`what`)."""
    try:
        call()
    except kind as e:
        for text in [texts] if isinstance(texts, str) else texts:
            assert text in str(e), str(e)
    else:
        raise AssertionError(what)


def set_collectives_mode(collectives: str) -> None:
    if collectives == "table":
        os.environ.pop("SYMMPOOL_COLLECTIVES", None)
    else:
        os.environ["SYMMPOOL_COLLECTIVES"] = collectives
