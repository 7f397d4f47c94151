"""Device arguments of the symmpool functions, as torch.cuda takes them."""

from __future__ import annotations

import torch

_ACCEPTED = "None, an int, 'cuda', 'cuda:N' or a torch.device of type cuda"


def device_index(device=None) -> int:
    """The CUDA device index ``device`` names; None and "cuda" (no index) mean
    the current device. Raises ValueError for anything else."""
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, bool):  # an int to Python, but surely a mistake
        raise ValueError(f"expected {_ACCEPTED}, got {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device index must not be negative, got {device}")
        return device
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError:
            raise ValueError(f"expected {_ACCEPTED}, got {device!r}") from None
    if not isinstance(device, torch.device):
        raise ValueError(f"expected {_ACCEPTED}, got {type(device).__name__} {device!r}")
    if device.type != "cuda":
        raise ValueError(f"symmpool memory is on CUDA devices, got {str(device)!r}")
    return torch.cuda.current_device() if device.index is None else device.index
