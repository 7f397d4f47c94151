"""Peer memory: another rank's copy of a symmetric buffer as a tensor, and
the barrier and signals that order work on it, for intra-node patterns
users write themselves (in PyTorch, Triton or CUDA) on a group whose CUDA
backend is "nccl" (a DeviceMesh dimension, the default group) or "symm".

A buffer is symmetric when every rank allocated it at the same place of its
symmpool heap (the same sizes in the same order, as SPMD code does).
``rendezvous`` checks that, on every rank together; ``peer_tensor`` then
views a peer's copy, read and written over NVLink (a copy with ``copy_``
runs on the copy engines). A hand-written all-gather::

    group = mesh.get_group("tp")                      # any "nccl" or "symm" group
    with torch.cuda.use_mem_pool(symmpool.mem_pool()):
        mine = torch.empty(n, device="cuda")          # symmetric on every rank
    mine.copy_(x)
    symmpool.rendezvous(mine, group)                  # collective, once
    symmpool.barrier(group)                           # every rank wrote its own
    out = torch.empty(world, n, device="cuda")
    for peer in range(world):
        out[peer].copy_(symmpool.peer_tensor(mine, peer, group))
    symmpool.barrier(group)                           # nobody reads `mine` any more

Ranks are the group's ranks. A view stays valid while its buffer lives on
every rank. ``barrier``, ``signal`` and ``wait`` use stream memory
operations (no SM); inside a CUDA graph capture they are one-thread kernels
counted on the device (a graph replays the host's counts unchanged), so a
signal sent in a graph is consumed by a wait in a graph, an eager one by an
eager wait. A wait that outlasts the group's timeout fails the group
for good, as a failed collective does. ``peer_memory_counts`` counts the
calls, fused ops (``symmpool.fused_ops``) and their NCCL fallbacks.
"""

from __future__ import annotations

import collections
from typing import Optional

import torch
import torch.distributed as dist

from . import _C

_counts: collections.Counter = collections.Counter()


def _group(group: Optional[dist.ProcessGroup]) -> dist.ProcessGroup:
    return group if group is not None else dist.group.WORLD


def _device_index(device) -> int:
    if device is None:
        return torch.cuda.current_device()
    return torch.device(device).index if not isinstance(device, int) else device


def _device_of_stream(stream: Optional[torch.cuda.Stream]) -> int:
    return _device_index(stream.device.index if stream is not None else None)


def _stream_handle(stream: Optional[torch.cuda.Stream]) -> Optional[int]:
    return None if stream is None else stream.cuda_stream


def is_available(group: Optional[dist.ProcessGroup] = None, device=None) -> bool:
    """Whether ``group``'s CUDA backend is "nccl" or "symm" and its ranks
    share a node. Collective the first time (it forms the group's heap);
    every rank gets the same answer."""
    return _C._peer_memory_available(_group(group).group_name, _device_index(device))


def rendezvous(tensor: torch.Tensor, group: Optional[dist.ProcessGroup] = None) -> None:
    """Collective: checks that ``tensor``'s bytes sit at the same place of
    every rank's heap, so ``peer_tensor`` may view them. Raises ValueError,
    the same on every rank, when they do not (a tensor outside symmpool's
    memory, or ranks that allocated differently); TypeError for a group
    whose CUDA backend is neither "nccl" nor "symm"."""
    why_not = _C._rendezvous(_group(group).group_name, tensor)
    _counts["rendezvous"] += 1
    if why_not:
        raise ValueError(f"symmpool.rendezvous: the tensor is not symmetric: {why_not}")


def peer_tensor(tensor: torch.Tensor, rank: int, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """A view of ``rank``'s copy of ``tensor`` (same shape, strides and
    dtype), mapped into this device. ``tensor``'s storage (``tensor`` or a
    tensor it is a view of) must have gone through ``rendezvous`` on every
    rank; a new tensor at a freed one's address needs its own rendezvous."""
    _counts["peer_tensor"] += 1
    return _C._peer_tensor(_group(group).group_name, tensor, rank)


def barrier(group: Optional[dist.ProcessGroup] = None, stream: Optional[torch.cuda.Stream] = None) -> None:
    """Collective: work enqueued after it on ``stream`` (current by default)
    starts once every rank's stream reached it (no SM used)."""
    _counts["barrier"] += 1
    _C._barrier(_group(group).group_name, _device_of_stream(stream), _stream_handle(stream))


def signal(peer: int, group: Optional[dist.ProcessGroup] = None,
           stream: Optional[torch.cuda.Stream] = None) -> None:
    """Tells ``peer`` that what ``stream`` did before is done and visible."""
    _counts["signal"] += 1
    _C._signal(_group(group).group_name, _device_of_stream(stream), peer, _stream_handle(stream))


def wait(peer: int, group: Optional[dist.ProcessGroup] = None,
         stream: Optional[torch.cuda.Stream] = None) -> None:
    """Holds ``stream`` until ``peer`` signalled once more than earlier waits
    on it consumed (signals are counted, never lost)."""
    _counts["wait"] += 1
    _C._wait(_group(group).group_name, _device_of_stream(stream), peer, _stream_handle(stream))


def release_group(group: Optional[dist.ProcessGroup] = None) -> bool:
    """Drops what symmpool made for a plain "nccl" group (the default group
    where None): its symmetric heap, communicator and fused-op workspace,
    after draining the device. Call it before dist.destroy_process_group on
    a group symmpool served (FSDP2's hooks, the fused ops, the peer API);
    a "symm" group's go with its backend. False where it had none."""
    return _C.release_group(_group(group).group_name)


def peer_memory_counts() -> dict:
    """Calls of this module's functions, and of the fused ops by where they
    ran (``<op>.fused``, ``<op>.fallback``, ``<op>.fallback: <why>``), in
    this process."""
    return {**_counts, **_C._fused_op_counts()}


def reset_peer_memory_counts() -> None:
    _counts.clear()
    _C._reset_fused_op_counts()
