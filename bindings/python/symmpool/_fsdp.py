"""FSDP2 helper: put FSDP2's all-gather and reduce-scatter buffers in symmpool memory."""

from __future__ import annotations

import torch.nn as nn


def allocate_fsdp_comm_buffers_from_symm(module: nn.Module) -> int:
    """Turns on ``set_allocate_memory_from_process_group_for_comm(True)`` for
    every FSDP2 module in ``module`` (itself included) and returns how many.

    The modules must be sharded over a process group whose CUDA backend is
    "symm"; otherwise FSDP2 falls back to ordinary ``torch.empty``.
    """
    from torch.distributed.fsdp import FSDPModule

    count = 0
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.set_allocate_memory_from_process_group_for_comm(True)
            count += 1
    if count == 0:
        raise ValueError("no FSDP2 module found: call fully_shard on the model first")
    return count
