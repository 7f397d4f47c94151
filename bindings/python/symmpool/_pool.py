"""The per-device symmpool cache: MemPool, statistics, empty_cache."""

from __future__ import annotations

import functools
import os

import torch

from . import _C
from ._device import device_index as _device_index


def library_path() -> str:
    """Path of libsymmpool.so, the library with the C ABI."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libsymmpool.so")


@functools.lru_cache(maxsize=None)
def _pluggable_allocator() -> torch.cuda.memory.CUDAPluggableAllocator:
    return torch.cuda.memory.CUDAPluggableAllocator(
        library_path(), "symmpool_malloc", "symmpool_free"
    )


def install() -> bool:
    """Makes symmpool the CUDA allocator of this process: every CUDA tensor,
    compute and communication alike, comes from symmpool's per-device cache,
    and ``torch.cuda.memory_stats``, ``memory_allocated``/``memory_reserved``
    and their peaks, ``memory_summary``, ``memory_snapshot``, ``empty_cache``,
    ``Tensor.record_stream`` and out-of-memory errors
    (``torch.OutOfMemoryError``) speak for it. CUDA graph capture,
    ``torch.cuda.MemPool`` and ``torch.compile(mode="reduce-overhead")`` get
    private pools, as under torch's allocator.

    Call it before the process's first CUDA allocation (RuntimeError after,
    and on a machine with no GPU). Returns False when symmpool already is
    the allocator. Not supported yet, each raising an error that names it:
    a MemPool with its own allocator, used on out-of-memory or that does not
    split; CUDA IPC, allocation history, peer access between devices of one
    process, memory fractions below 1.
    """
    return _C._install_process_allocator()


def mem_pool() -> torch.cuda.MemPool:
    """A new ``torch.cuda.MemPool`` whose segments come from symmpool.

    Use it with ``torch.cuda.use_mem_pool(pool)``. Every pool draws on the same
    per-device symmpool cache, so segments registered with a "symm" process
    group serve tensors allocated in any of them.
    """
    return torch.cuda.MemPool(_pluggable_allocator().allocator())


def memory_stats(device=None) -> dict:
    """Counters of the symmpool cache of ``device`` (default: current): all
    zero on a device this process never allocated on (asking makes no cache
    and no CUDA context there)."""
    return _C.memory_stats(_device_index(device))


def reset_peak_memory_stats(device=None) -> None:
    _C.reset_peak_memory_stats(_device_index(device))


def empty_cache(device=None) -> int:
    """Gives unused cached segments back to the driver; returns the bytes freed
    (0 on a device this process never allocated on)."""
    return _C.empty_cache(_device_index(device))


def owns(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory lies in a symmpool segment."""
    return _C.owns(tensor)
