"""Checks of symmpool as the process's CUDA allocator, each run in a fresh
process (the allocator is chosen once per process):

    python process_allocator_checks.py <check>

Exits 0 when the check holds; an assertion names what did not."""

from __future__ import annotations

import os
import sys

os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
                  SYMMPOOL_DISABLE_MULTICAST="1")

import torch  # noqa: E402

import symmpool  # noqa: E402

MiB = 1 << 20


def _agree_with_symmpool() -> None:
    """torch's figures are symmpool's, and the pools add up."""
    torch.cuda.synchronize()
    ours, theirs = symmpool.memory_stats(), torch.cuda.memory_stats()
    for name in ("allocated_bytes", "requested_bytes", "reserved_bytes"):
        for field in ("current", "peak"):
            assert theirs[f"{name}.all.{field}"] == ours[name][field], (name, field, theirs, ours)
    assert theirs["allocation.all.current"] == ours["active_blocks"]["current"], (theirs, ours)
    assert theirs["segment.all.current"] == ours["segments"]["current"], (theirs, ours)
    assert theirs["allocation.all.allocated"] == ours["allocations"], (theirs, ours)
    assert theirs["allocation.all.freed"] == ours["frees"], (theirs, ours)
    for name in ("allocated_bytes", "requested_bytes", "allocation"):
        pools = theirs[f"{name}.small_pool.current"] + theirs[f"{name}.large_pool.current"]
        assert pools == theirs[f"{name}.all.current"], (name, theirs)
    assert torch.cuda.memory_allocated() == ours["allocated_bytes"]["current"]
    assert torch.cuda.memory_reserved() == ours["reserved_bytes"]["current"]
    assert torch.cuda.max_memory_allocated() == ours["allocated_bytes"]["peak"]


def memory_api() -> None:
    assert symmpool.install() is True
    assert symmpool.install() is False, "a second install() must say it changed nothing"
    small = torch.empty(1000, dtype=torch.uint8, device="cuda")
    large = torch.empty(6 * MiB, dtype=torch.uint8, device="cuda")
    assert symmpool.owns(small) and symmpool.owns(large), "tensors must come from symmpool"
    assert torch.cuda.memory_stats()["allocated_bytes.small_pool.current"] >= 1024
    assert torch.cuda.memory_stats()["allocated_bytes.large_pool.current"] >= 6 * MiB
    _agree_with_symmpool()

    summary = torch.cuda.memory_summary()
    assert "Allocated memory" in summary, summary

    snapshot = torch.cuda.memory_snapshot()
    spans = [(s["address"], s["address"] + s["total_size"]) for s in snapshot]
    for ptr in (small.data_ptr(), large.data_ptr()):
        assert any(lo <= ptr < hi for lo, hi in spans), f"{ptr:#x} in no segment: {spans}"
    for s in snapshot:
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"], s
        assert s["allocated_size"] == sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated"), s

    torch.cuda.reset_peak_memory_stats()
    _agree_with_symmpool()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        large.add_(1)
    large.record_stream(side)
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    del small, large
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() == allocated - 1024 - 6 * MiB, (torch.cuda.memory_allocated(), allocated)
    assert torch.cuda.memory_reserved() < reserved, (torch.cuda.memory_reserved(), reserved)
    torch.cuda.reset_accumulated_memory_stats()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == 0
    _agree_with_symmpool()


def training_steps() -> None:
    """A model's steps (autograd's backward thread, fused AdamW, a side
    stream) run on symmpool and give torch's allocator's losses."""
    symmpool.install()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    for step in range(5):
        x = torch.randn(64 * (step + 1), 512, device="cuda")  # a new size each step
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    assert symmpool.memory_stats()["allocations"] > 50
    for p in model.parameters():
        assert symmpool.owns(p) and p.isfinite().all()
    _agree_with_symmpool()
    print(f"loss {loss.item():.6f}")


def out_of_memory() -> None:
    symmpool.install()
    observed = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: observed.append(args))
    free, total = torch.cuda.mem_get_info()
    try:
        torch.empty(total - MiB, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        message = str(e)
        for words in ("out of memory on device", "tried to allocate", "reserved", "allocated",
                      "largest free cached block", "free of"):
            assert words in message, message
    else:
        raise AssertionError("an allocation of the whole device succeeded")
    assert len(observed) == 1, observed
    assert torch.cuda.memory_stats()["num_ooms"] == 1
    torch.empty(MiB, device="cuda")  # still serves


def unsupported_features_are_named() -> None:
    symmpool.install()
    x = torch.ones(16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            x.mul_(2)
    except RuntimeError as e:
        assert "symmpool" in str(e) and "private pools" in str(e), str(e)
    else:
        raise AssertionError("a CUDA graph capture must name what symmpool cannot do yet")
    for call, words in ((lambda: torch.cuda.memory._record_memory_history(), "allocation history"),
                        (lambda: torch.cuda.set_per_process_memory_fraction(0.5), "memory fraction")):
        try:
            call()
        except RuntimeError as e:
            assert words in str(e), str(e)
        else:
            raise AssertionError(f"expected an error naming {words}")


def install_after_cuda_allocation_is_refused() -> None:
    torch.zeros(1, device="cuda")
    try:
        symmpool.install()
    except RuntimeError as e:
        assert "before the process's first CUDA allocation" in str(e), str(e)
    else:
        raise AssertionError("install() after an allocation must fail")


if __name__ == "__main__":
    globals()[sys.argv[1]]()
