"""The c10d backend "symm": ProcessGroupNCCL with symmpool tensor allocation."""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed import ProcessGroupNCCL

from . import _C

BACKEND_NAME = "symm"


def _split_like_nccl(options, ranks_in_group) -> None:
    """Splits the new group's NCCL communicator from the default group's where
    torch would for a "nccl" group. torch makes every rank outside a new group
    join that split (perform_nocolor_split), so the ranks inside must split
    too, or they would wait on each other forever."""
    if not dist.is_initialized() or not ranks_in_group:  # the default group itself
        return
    c10d = dist.distributed_c10d
    default = c10d._get_default_group()
    if not default.bound_device_id:
        return
    split_from = c10d._get_split_source(default)
    if split_from is not None:
        options.split_from = split_from
        options.split_color = c10d._process_group_color(ranks_in_group)


def _create_symm_backend(dist_backend_opts, backend_options):
    if backend_options is None:
        options = ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
    elif isinstance(backend_options, ProcessGroupNCCL.Options):
        options = backend_options
    else:
        raise TypeError(
            "the symm backend takes ProcessGroupNCCL.Options as pg_options, "
            f"got {type(backend_options).__name__}"
        )
    options._timeout = dist_backend_opts.timeout
    options.global_ranks_in_group = dist_backend_opts.global_ranks_in_group
    options.group_name = dist_backend_opts.group_id
    _split_like_nccl(options, dist_backend_opts.global_ranks_in_group)
    return _C._create_backend(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        options,
    )


def register_backend() -> None:
    """Registers "symm" with torch.distributed (once per process)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(
        BACKEND_NAME, _create_symm_backend, extended_api=True, devices=["cuda"]
    )
