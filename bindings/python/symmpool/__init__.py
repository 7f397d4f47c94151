"""symmpool: symmetric, NCCL-registered CUDA memory for PyTorch.

Importing this package registers the c10d backend ``"symm"`` for CUDA.
"""

from __future__ import annotations

import torch
import torch.distributed  # noqa: F401  (the extension takes c10d types)

from . import _C
from . import ops  # registers torch.ops.symmpool.*
from ._backend import BACKEND_NAME, register_backend
from ._fsdp import allocate_fsdp_comm_buffers_from_symm
from ._pool import empty_cache, library_path, mem_pool, memory_stats, owns, reset_peak_memory_stats

register_backend()

__all__ = [
    "BACKEND_NAME",
    "allocate_fsdp_comm_buffers_from_symm",
    "empty_cache",
    "library_path",
    "mem_pool",
    "memory_stats",
    "owns",
    "reset_peak_memory_stats",
]
