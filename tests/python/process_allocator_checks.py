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


def _pool_segments(pool) -> list[tuple[int, int]]:
    return [(s["address"], s["address"] + s["total_size"]) for s in torch.cuda.memory_snapshot()
            if tuple(s["segment_pool_id"]) == tuple(pool)]


def _inside(tensor: torch.Tensor, spans: list[tuple[int, int]]) -> bool:
    return any(lo <= tensor.data_ptr() < hi for lo, hi in spans)


def cuda_graphs() -> None:
    """A captured graph's memory is its own private pool: eager tensors made
    after the capture never share it, so replays stay right; it goes back to
    the device once the graph and its outputs are gone."""
    symmpool.install()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
    static_x = torch.randn(32, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up as torch's docs do
        for _ in range(2):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = model(static_x)
    pool = graph.pool()
    spans = _pool_segments(pool)
    assert spans and _inside(static_y, spans), f"the graph's output must be in its pool: {spans}"
    eager = [torch.full((32, 256), float(i), device="cuda") for i in range(64)]  # would reuse freed blocks
    assert not any(_inside(t, spans) for t in eager), "an eager tensor got the graph's memory"
    for _ in range(3):
        static_x.copy_(torch.randn(32, 256, device="cuda"))
        graph.replay()
        torch.testing.assert_close(static_y, model(static_x), rtol=0, atol=0)
    assert all((t == i).all() for i, t in enumerate(eager)), "a replay wrote into an eager tensor"
    _agree_with_symmpool()
    reserved = torch.cuda.memory_reserved()
    del graph, static_y
    # cuBLAS's workspace for the capture stream was allocated in the capture
    # and torch keeps it (as under its own allocator) until told to let go.
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    left = [(s["address"], [(b["size"], b["state"]) for b in s["blocks"]]) for s in torch.cuda.memory_snapshot()
            if tuple(s["segment_pool_id"]) == tuple(pool)]
    assert not left, f"the graph's segments must go back once it and its outputs are gone: {left}"
    assert torch.cuda.memory_reserved() < reserved


def mem_pool() -> None:
    """torch.cuda.MemPool and use_mem_pool: what is made inside lives in the
    pool's own segments, which go back when the pool goes."""
    symmpool.install()
    pool = torch.cuda.MemPool()
    assert pool.use_count() == 1, pool.use_count()
    with torch.cuda.use_mem_pool(pool):
        assert pool.use_count() == 2, pool.use_count()
        inside = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
    outside = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
    assert pool.use_count() == 1, pool.use_count()
    spans = [(s["address"], s["address"] + s["total_size"]) for s in pool.snapshot()]
    assert _inside(inside, spans) and not _inside(outside, spans), spans
    del inside
    again = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
    assert not _inside(again, spans), "a block of the pool went to an allocation outside it"
    reserved = torch.cuda.memory_reserved()
    del pool
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() < reserved, "the pool's segment must go back with the pool"
    _agree_with_symmpool()


def reduce_overhead() -> None:
    """torch.compile(mode="reduce-overhead"): CUDA graph trees over symmpool's
    private pools, their checkpoints included, give the eager results."""
    symmpool.install()
    torch.manual_seed(0)
    restores = []
    set_state = torch._C._cuda_setCheckpointPoolState

    def counted(*args):
        restores.append(1)
        return set_state(*args)

    torch._C._cuda_setCheckpointPoolState = counted
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
    reference = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, mode="reduce-overhead")
    kept = []
    for step in range(6):
        x = torch.randn(64, 256, device="cuda")
        loss = compiled(x).square().mean()
        loss.backward()
        ref_loss = reference(x).square().mean()
        ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
            p.grad = q.grad = None
        # An inference call while a training step's outputs live: a new
        # branch of the tree, recorded after replays (a checkpoint restore).
        with torch.no_grad():
            kept.append(compiled(x).clone())
            torch.testing.assert_close(kept[-1], reference(x), rtol=1e-5, atol=1e-5)
    torch.cuda.synchronize()
    print(f"checkpoint restores: {len(restores)}")
    _agree_with_symmpool()


def unsupported_features_are_named() -> None:
    symmpool.install()
    for call, words in ((lambda: torch.cuda.memory._record_memory_history(), "allocation history"),
                        (lambda: torch.cuda.MemPool(use_on_oom=True), "MemPool used on out-of-memory"),
                        (lambda: torch.cuda.MemPool(no_split=True), "MemPool that does not split"),
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
