"""The c10d backend "symm": ProcessGroupNCCL with symmpool tensor allocation."""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed import ProcessGroupNCCL

from . import _C

BACKEND_NAME = "symm"


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
