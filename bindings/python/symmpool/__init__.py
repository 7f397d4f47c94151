"""symmpool: symmetric, NCCL-registered CUDA memory for PyTorch.

Importing this package registers the c10d backend ``"symm"`` for CUDA.
"""

from __future__ import annotations

import torch
import torch.distributed  # noqa: F401  (the extension takes c10d types)

from . import _C
from . import fsdp  # symmpool.fsdp.enable(model): FSDP2 on a plain NCCL mesh
from . import fused_ops  # registers torch.ops.symmpool.fused_* and pipelined_*
from . import ops  # registers torch.ops.symmpool.*
from ._backend import BACKEND_NAME, register_backend
from ._fsdp import allocate_fsdp_comm_buffers_from_symm
from ._pool import empty_cache, install, library_path, mem_pool, memory_stats, owns, reset_peak_memory_stats
from .fused_ops import reserve_workspace
from .peer_memory import (barrier, is_available, peer_memory_counts, peer_tensor, release_group, rendezvous,
                          reset_peer_memory_counts, signal, wait)

register_backend()

__all__ = [
    "BACKEND_NAME",
    "allocate_fsdp_comm_buffers_from_symm",
    "barrier",
    "empty_cache",
    "fsdp",
    "install",
    "is_available",
    "library_path",
    "mem_pool",
    "memory_stats",
    "owns",
    "peer_memory_counts",
    "peer_tensor",
    "release_group",
    "rendezvous",
    "reserve_workspace",
    "reset_peak_memory_stats",
    "reset_peer_memory_counts",
    "signal",
    "wait",
]
