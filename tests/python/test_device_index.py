"""Device arguments and queries on devices the process never used; no GPU needed."""

import subprocess
import sys
import textwrap

import pytest
import torch

from symmpool._device import device_index
from launch import gpu_count


@pytest.fixture
def current_device_3(monkeypatch):
    """torch.cuda.current_device() answers 3, with or without a GPU."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)


@pytest.mark.parametrize("device", [None, "cuda", torch.device("cuda")])
def test_no_index_means_the_current_device(current_device_3, device):
    assert device_index(device) == 3


@pytest.mark.parametrize(
    "device, index",
    [(0, 0), (1, 1), ("cuda:0", 0), ("cuda:1", 1), (torch.device("cuda", 2), 2), (torch.device("cuda:1"), 1)],
)
def test_explicit_indices(current_device_3, device, index):
    assert device_index(device) == index


@pytest.mark.parametrize(
    "device, message",
    [
        (-1, "must not be negative"),
        (True, "expected None, an int"),
        ("cpu", "on CUDA devices"),
        (torch.device("cpu"), "on CUDA devices"),
        ("cuda:x", "expected None, an int"),
        ("gpu", "expected None, an int"),
        (1.0, "got float 1.0"),
        ([0], "got list"),
    ],
)
def test_bad_devices_raise_value_error(device, message):
    with pytest.raises(ValueError, match=message):
        device_index(device)


# Run in a fresh process, so that no earlier test has used device 0. With
# "check-context" it also asks the driver whether device 0's primary context
# was created (the queries must not create it).
_NEVER_USED_DEVICE = textwrap.dedent(
    """
    import ctypes, sys
    import torch
    import symmpool

    stats = symmpool.memory_stats(0)
    for key in ("allocated_bytes", "requested_bytes", "reserved_bytes", "active_blocks", "segments"):
        assert stats[key] == {"current": 0, "peak": 0}, (key, stats)
    assert stats["allocations"] == 0 and stats["segment_maps"] == 0, stats
    symmpool.reset_peak_memory_stats("cuda:0")
    assert symmpool.empty_cache(torch.device("cuda", 0)) == 0

    if sys.argv[1:] == ["check-context"]:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        assert cuda.cuInit(0) == 0
        assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
        assert cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) == 0
        assert active.value == 0, "a query created device 0's CUDA context"
    print("ok")
    """
)


def _run_never_used_device_script(*args):
    out = subprocess.run([sys.executable, "-c", _NEVER_USED_DEVICE, *args], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_queries_on_a_never_used_device_give_zeros():
    # Before, they made the device's allocator: without a GPU that raised.
    _run_never_used_device_script()


@pytest.mark.skipif(gpu_count() < 1, reason=f"needs a CUDA GPU, found {gpu_count()}")
def test_queries_on_a_never_used_device_make_no_cuda_context():
    _run_never_used_device_script("check-context")
