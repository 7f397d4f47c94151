"""Bodies of the fused-op and peer-memory tests, one process per rank
(launch.run_workers). The CPU ones run on gloo (every fused op falls back to
the unfused ops there); the GPU ones on a "symm" group or a plain "nccl"
one (`backend`), against NCCL (or, where the ranks share a GPU, against
the inputs gathered over gloo)."""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

from dist_common import expect_error, init_group, ranks_share_gpu

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _reference_group():
    """NCCL's group, the reference. None where the ranks share a GPU (NCCL
    refuses them): the references then gather every rank's inputs over gloo
    and compute the collective's result here."""
    return None if ranks_share_gpu() else dist.new_group(backend="nccl")


def _every_ranks(t):
    """[rank 0's t, rank 1's t, ...], exact: bytes over gloo."""
    local = t.detach().contiguous().cpu()
    flat = local.reshape(-1).view(torch.uint8)
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, flat)
    return [p.view(local.dtype).reshape(local.shape).to(t.device) for p in parts]


def _references(A_shard, Bs, gather_dim, group):
    """What the fused ops must equal, from the unfused collectives."""
    x = A_shard.movedim(gather_dim, 0).contiguous()
    if group is None:
        gathered = torch.cat(_every_ranks(x))
    else:
        gathered = x.new_empty((group.size() * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(gathered, x, group=group)
    A = gathered.movedim(0, gather_dim)
    return A, [A @ B for B in Bs]


def _reduce_scatter_reference(A, B, reduce_op, scatter_dim, group):
    product = (A @ B).movedim(scatter_dim, 0).contiguous()
    if group is None:
        world, rank = dist.get_world_size(), dist.get_rank()
        total = torch.stack([p.float() for p in _every_ranks(product)]).sum(0)
        n = product.shape[0] // world
        out = (total if reduce_op == "sum" else total / world)[rank * n:(rank + 1) * n].to(product.dtype)
        return out.movedim(0, scatter_dim)
    out = product.new_empty((product.shape[0] // group.size(), *product.shape[1:]))
    op = dist.ReduceOp.SUM if reduce_op == "sum" else dist.ReduceOp.AVG
    dist.reduce_scatter_tensor(out, product, op=op, group=group)
    return out.movedim(0, scatter_dim)


def _all_to_all_reference(A, B, group):
    if group is None:
        rank, n = dist.get_rank(), A.shape[0] // dist.get_world_size()
        return torch.cat([p[rank * n:(rank + 1) * n] for p in _every_ranks((A @ B).contiguous())])
    out = A.new_empty(A.shape[0], B.shape[1])
    dist.all_to_all_single(out, (A @ B).contiguous(), group=group)
    return out


def _close(actual, expected, what):
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, \
        f"{what}: {actual.dtype} {tuple(actual.shape)} vs {expected.dtype} {tuple(expected.shape)}"
    assert not actual.isnan().any(), f"{what}: NaN left (a poisoned byte never written)"
    tol = TOLERANCE[actual.dtype]
    largest = expected.abs().max().item() if expected.numel() else 0.0
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol * max(1.0, largest),
                               msg=lambda m: f"{what}: {m}")


# Shapes: (A_shard shape, gather_dim, B columns): odd row counts, 2-D and 3-D,
# gathered along rows, a middle dim and the last (K) dim.
ALL_GATHER_CASES = [((37, 96), 0, (40, 24)), ((3, 17, 64), 1, (48,)), ((5, 33, 32), 0, (16, 8)),
                    ((29, 48), 1, (40,)), ((2, 7, 32), 2, (24,))]
# (A shape, scatter_dim, N): rows, a middle dim and the last (N) dim scattered.
REDUCE_SCATTER_CASES = [((74, 96), 0, 40), ((3, 34, 64), 1, 48), ((30, 48), 1, 64), ((4, 6, 32), 2, 24)]


def _cases(world, gen, dtype, device):
    """Random inputs for every case, scaled so that the group divides them."""
    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    ag = []
    for shard, gather_dim, ns in ALL_GATHER_CASES:
        k = shard[-1] * (world if gather_dim == len(shard) - 1 else 1)
        ag.append((rand(*shard), [rand(k, n) for n in ns], gather_dim))
    rs = []
    for shape, scatter_dim, n in REDUCE_SCATTER_CASES:
        shape = list(shape)
        if scatter_dim == len(shape) - 1:
            n *= world
        else:
            shape[scatter_dim] *= world
        rs.append((rand(*shape), rand(shape[-1], n), scatter_dim))
    return ag, rs


SYMM = "cpu:gloo,cuda:symm"
NCCL = "cpu:gloo,cuda:nccl"


def _set_one_shot_bytes(one_shot_bytes: str) -> None:
    """SYMMPOOL_TP_ONE_SHOT_BYTES for this worker, read at its first fused
    call: "0" pipelines every fused call shard by shard."""
    if one_shot_bytes:
        os.environ["SYMMPOOL_TP_ONE_SHOT_BYTES"] = one_shot_bytes


def _check_one_step_counts(counts: dict, one_shot_bytes: str, rank: int) -> None:
    """Calls ran in one step where small (the default), none with "0"; a
    gather along K is always pipelined."""
    fused = sum(v for k, v in counts.items() if k.endswith(".fused"))
    one_step = sum(v for k, v in counts.items() if k.endswith(".fused in one step"))
    if one_shot_bytes == "0":
        assert one_step == 0, f"rank {rank}: calls ran in one step with SYMMPOOL_TP_ONE_SHOT_BYTES=0: {counts}"
    else:
        assert 0 < one_step < fused, f"rank {rank}: {one_step} of {fused} fused calls in one step: {counts}"


def fused_ops_match_unfused(rank: int, world: int, on_gpu: bool, dtypes: list, store_file: str = "",
                            backend: str = SYMM, one_shot_bytes: str = "") -> None:
    """Every fused op, every case and dtype, equals the unfused collectives
    on the same random data; on a "symm" or plain "nccl" group the fused
    path ran (counted; small calls in one step unless `one_shot_bytes` is
    "0"), on gloo the fallback did."""
    import symmpool

    _set_one_shot_bytes(one_shot_bytes)

    if on_gpu:
        device = init_group(rank, world, backend)
        reference_group = _reference_group()
    else:
        device = torch.device("cpu")
        # A file store: with a TCP store, a rank tearing down after its peer
        # (the store's host) left was seen to abort in gloo.
        dist.init_process_group("gloo", rank=rank, world_size=world, store=dist.FileStore(store_file, world))
        reference_group = dist.group.WORLD
    group = dist.group.WORLD
    name = group.group_name
    gen = torch.Generator().manual_seed(1234 + rank)
    symmpool.reset_peer_memory_counts()
    calls = 0
    for dtype in dtypes:
        ag, rs = _cases(world, gen, dtype, device)
        for A_shard, Bs, gather_dim in ag:
            _poison_workspace(name, device)
            A, outs = torch.ops.symmpool.fused_all_gather_matmul(A_shard, Bs, gather_dim, world, name)
            A_ref, outs_ref = _references(A_shard, Bs, gather_dim, reference_group)
            what = f"rank {rank} all_gather_matmul {dtype} shard {tuple(A_shard.shape)} dim {gather_dim}"
            assert torch.equal(A, A_ref), f"{what}: gathered A differs"
            for i, (out, ref) in enumerate(zip(outs, outs_ref)):
                _close(out, ref, f"{what} B{i}")
            calls += 1
        for A, B, scatter_dim in rs:
            for reduce_op in ("sum", "avg"):
                _poison_workspace(name, device)
                out = torch.ops.symmpool.fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, world, name)
                ref = _reduce_scatter_reference(A, B, reduce_op, scatter_dim, reference_group)
                _close(out, ref, f"rank {rank} matmul_reduce_scatter {reduce_op} {dtype} A {tuple(A.shape)} "
                                 f"dim {scatter_dim}")
                calls += 1
        A, B = torch.randn(6 * world, 40, generator=gen).to(dtype).to(device), \
            torch.randn(40, 24, generator=gen).to(dtype).to(device)
        _poison_workspace(name, device)
        out = torch.ops.symmpool.pipelined_produce_and_all_to_all(A, B, world, name)
        _close(out, _all_to_all_reference(A, B, reference_group), f"rank {rank} produce_and_all_to_all {dtype}")
        calls += 1
    # Each rank's Bs are its own: rank 1's second B has no columns (an uneven
    # split), and every rank still takes the same path.
    A_shard = torch.randn(9, 32, generator=gen).to(device)
    Bs = [torch.randn(32, 8, generator=gen).to(device),
          torch.randn(32, 0 if rank == 1 else 5, generator=gen).to(device)]
    A, outs = torch.ops.symmpool.fused_all_gather_matmul(A_shard, Bs, 0, world, name)
    A_ref, outs_ref = _references(A_shard, Bs, 0, reference_group)
    assert torch.equal(A, A_ref), f"rank {rank} all_gather_matmul with an empty B: gathered A differs"
    for i, (out, ref) in enumerate(zip(outs, outs_ref)):
        _close(out, ref, f"rank {rank} all_gather_matmul with an empty B, B{i}")
    calls += 1
    # A row-parallel split may leave one rank no columns of A (rows of B):
    # the product has the same shape on every rank, and every rank takes the
    # same path (rank 1 once fell back alone and rank 0 waited for it).
    k = 0 if rank == 1 else 16
    A = torch.randn(4 * world, k, generator=gen).to(device)
    B = torch.randn(k, 12, generator=gen).to(device)
    _poison_workspace(name, device)
    out = torch.ops.symmpool.fused_matmul_reduce_scatter(A, B, "sum", 0, world, name)
    _close(out, _reduce_scatter_reference(A, B, "sum", 0, reference_group),
           f"rank {rank} matmul_reduce_scatter with no columns of A on rank 1")
    calls += 1
    counts = symmpool.peer_memory_counts()
    where = "fused" if on_gpu else "fallback"
    ran = sum(v for k, v in counts.items() if k.endswith(f".{where}"))
    assert ran == calls, f"rank {rank}: {ran} of {calls} calls ran {where}: {counts}"
    if on_gpu:
        _check_one_step_counts(counts, one_shot_bytes, rank)
    print(f"[rank {rank}] {calls} fused-op calls matched the unfused ops ({where}): {counts}", flush=True)
    if on_gpu and backend == NCCL:
        # What symmpool made for the plain group goes with release_group, workspace included.
        torch.cuda.synchronize()
        assert symmpool._C._fused_workspace(name, device.index) is not None
        assert symmpool.release_group(group), "release_group found nothing for the plain group"
        assert symmpool._C._fused_workspace(name, device.index) is None, "the workspace outlived its group"
        assert not symmpool.release_group(group)
    if not on_gpu:
        # gloo's teardown aborted a rank about once in six runs here ("terminate
        # called without an active exception", after every check passed, with
        # a TCP or a file store): leave without it once both ranks are done.
        dist.barrier()
        sys.stdout.flush()
        os._exit(0)
    dist.destroy_process_group()


def _poison_workspace(group_name, device):
    """NaN bytes everywhere in the workspace: a result that reads a byte no
    copy wrote shows."""
    import symmpool

    index = getattr(device, "index", None)
    ws = symmpool._C._fused_workspace(group_name, index) if index is not None else None
    if ws is not None and ws.buffer is not None:
        ws.buffer.fill_(0xFF)


def fused_ops_replay_in_cuda_graphs_and_compile(rank: int, world: int, backend: str = SYMM,
                                                one_shot_bytes: str = "") -> None:
    """The fused ops captured in a CUDA graph (workspace reserved first), run
    eagerly while that capture is open, and compiled with
    torch.compile(fullgraph=True) give what eager gives (in one step or,
    with `one_shot_bytes` "0", pipelined)."""
    import symmpool

    _set_one_shot_bytes(one_shot_bytes)

    device = init_group(rank, world, backend)
    name = dist.group.WORLD.group_name
    gen = torch.Generator().manual_seed(7 + rank)
    A_shard = torch.randn(64, 128, generator=gen).to(torch.bfloat16).to(device)
    B = torch.randn(128, 96, generator=gen).to(torch.bfloat16).to(device)
    C = torch.randn(96, 128, generator=gen).to(torch.bfloat16).to(device)

    def step(a, b, c):
        full, (h,) = torch.ops.symmpool.fused_all_gather_matmul(a, [b], 0, world, name)
        return full, torch.ops.symmpool.fused_matmul_reduce_scatter(h, c, "sum", 0, world, name)

    eager = step(A_shard, B, C)
    assert symmpool.reserve_workspace(64 << 20), "the workspace came out asymmetric"
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    static_a = A_shard.clone()
    side = torch.cuda.Stream()
    # Relaxed: the eager op below may allocate while the capture is open.
    with torch.cuda.graph(graph, capture_error_mode="relaxed"):
        captured = step(static_a, B, C)
        # The same group's ops run eagerly on another stream while the
        # capture is open: their copies must run now, not on the copy
        # stream the capture took (that failed: error 905).
        with torch.cuda.stream(side):
            during = step(A_shard, B, C)
    side.synchronize()
    for got, want, what in zip(during, eager, ("gathered A", "reduce-scattered product")):
        _close(got, want, f"rank {rank} eager during a capture: {what}")
    for replay in range(3):
        fresh = torch.randn(64, 128, generator=gen).to(torch.bfloat16).to(device)
        static_a.copy_(fresh)
        for t in captured:
            t.fill_(float("nan"))
        graph.replay()
        expected = step(fresh, B, C)
        for got, want, what in zip(captured, expected, ("gathered A", "reduce-scattered product")):
            _close(got, want, f"rank {rank} graph replay {replay} {what}")
    compiled = torch.compile(step, fullgraph=True)
    for got, want, what in zip(compiled(A_shard, B, C), eager, ("gathered A", "reduce-scattered product")):
        _close(got, want, f"rank {rank} compiled {what}")
    print(f"[rank {rank}] graph replays and the compiled step matched eager", flush=True)
    del graph
    dist.destroy_process_group()


def a_reserved_workspace_is_kept(rank: int, world: int) -> None:
    """reserve_workspace grows the group's workspace once; later calls find
    the same one. Each lookup used to get a new Python wrapper of the
    backend, which replaced the workspace: a CUDA graph capture right after
    reserving found 0 bytes, and every eager call allocated a new one."""
    import gc

    import symmpool

    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    key = (dist.group.WORLD.group_name, device.index)
    assert symmpool.reserve_workspace(4 << 20), "the workspace came out asymmetric"
    ws = symmpool._C._fused_workspace(*key)
    identity, address = ws.id, ws.buffer.data_ptr()
    del ws
    gc.collect()  # no Python wrapper of the backend is left
    assert symmpool.reserve_workspace(1 << 20) and symmpool.reserve_workspace(4 << 20)
    ws = symmpool._C._fused_workspace(*key)
    assert ws.id == identity and ws.buffer.data_ptr() == address, "the workspace was replaced"
    print(f"[rank {rank}] the reserved workspace was kept", flush=True)
    dist.destroy_process_group()


def a_destroyed_groups_workspace_is_freed(rank: int, world: int) -> None:
    """A group's workspace goes back to symmpool's allocator when the group
    is destroyed; it used to stay allocated until the process ended. The
    default group's workspace, which nobody destroyed, stays."""
    import symmpool

    device = init_group(rank, world, "cpu:gloo,cuda:symm")

    def allocated() -> int:
        torch.cuda.synchronize()
        return symmpool.memory_stats(device)["allocated_bytes"]["current"]

    assert symmpool.reserve_workspace(2 << 20), "the default group's workspace came out asymmetric"
    kept = symmpool._C._fused_workspace(dist.group.WORLD.group_name, device.index).id
    sub = dist.new_group(backend="cpu:gloo,cuda:symm")
    before = allocated()
    assert symmpool.reserve_workspace(64 << 20, group=sub), "the subgroup's workspace came out asymmetric"
    grown = allocated()
    assert grown - before >= 64 << 20, f"the workspace took {grown - before} bytes"
    name = sub.group_name
    dist.destroy_process_group(sub)
    assert symmpool._C._fused_workspace(name, device.index) is None, "the destroyed group's workspace is kept"
    after = allocated()
    assert after <= before, f"{after - before} bytes still allocated after the group was destroyed"
    ws = symmpool._C._fused_workspace(dist.group.WORLD.group_name, device.index)
    assert ws is not None and ws.id == kept, "the default group's workspace went too"
    print(f"[rank {rank}] {grown - before} bytes of workspace freed with their group", flush=True)
    dist.destroy_process_group()


def fused_ops_back_to_back_with_a_late_rank(rank: int, world: int) -> None:
    """Fused calls issued back to back with no host sync between them, rank 0
    held back before each by a GPU sleep, alternating two streams, the
    workspace growing halfway: every result, checked only at the end,
    equals the unfused ops. A missing barrier or a workspace reused while a
    peer still reads it shows here (the lockstep tests above hide it)."""
    import symmpool

    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    reference_group = _reference_group()
    name = dist.group.WORLD.group_name
    gen = torch.Generator().manual_seed(31 + rank)
    streams = [torch.cuda.current_stream(), torch.cuda.Stream()]
    inputs, results = [], []
    for call in range(40):
        rows = 64 if call < 20 else 4096  # the second half needs a larger workspace
        A_shard = torch.randn(rows, 256, generator=gen).to(torch.bfloat16).to(device)
        B = torch.randn(256, 128, generator=gen).to(torch.bfloat16).to(device)
        C = torch.randn(128, 256, generator=gen).to(torch.bfloat16).to(device)
        stream = streams[call % 2]
        stream.wait_stream(torch.cuda.current_stream())  # the inputs are ready
        with torch.cuda.stream(stream):
            if rank == 0:
                torch.cuda._sleep(2_000_000)  # about 1 ms late at every call
            A, (h,) = torch.ops.symmpool.fused_all_gather_matmul(A_shard, [B], 0, world, name)
            y = torch.ops.symmpool.fused_matmul_reduce_scatter(h, C, "sum", 0, world, name)
        torch.cuda.current_stream().wait_stream(stream)
        inputs.append((A_shard, B, C))
        results.append((A, h, y))
    for call, ((A_shard, B, C), (A, h, y)) in enumerate(zip(inputs, results)):
        A_ref, (h_ref,) = _references(A_shard, [B], 0, reference_group)
        assert torch.equal(A, A_ref), f"rank {rank} call {call}: gathered A differs"
        _close(h, h_ref, f"rank {rank} call {call} all_gather_matmul")
        _close(y, _reduce_scatter_reference(h, C, "sum", 0, reference_group), f"rank {rank} call {call} mm_rs")
    counts = symmpool.peer_memory_counts()
    assert counts.get("fused_all_gather_matmul.fused") == 40, counts
    print(f"[rank {rank}] 40 back-to-back fused pairs on two streams matched", flush=True)
    dist.destroy_process_group()


def fused_ops_on_an_nccl_group_and_nccl_fallbacks(rank: int, world: int) -> None:
    """On a plain NCCL group the fused ops run fused (symmpool forms the
    group's heap on demand) and match NCCL. The functional ops there run
    synchronous NCCL calls where the router leaves them to NCCL, for which
    ProcessGroupNCCL returns no Work (torch >= 2.8): waiting on it crashed
    every rank (SIGSEGV) before wait_if_any."""
    import symmpool

    init_group(rank, world, "nccl")
    group = dist.group.WORLD
    name = group.group_name
    device = torch.device("cuda", rank)
    symmpool.reset_peer_memory_counts()
    gen = torch.Generator().manual_seed(rank)
    A_shard = torch.randn(16, 32, generator=gen).to(device)
    B = torch.randn(32, 8, generator=gen).to(device)
    A, (out,) = torch.ops.symmpool.fused_all_gather_matmul(A_shard, [B], 0, world, name)
    A_ref, (out_ref,) = _references(A_shard, [B], 0, group)
    assert torch.equal(A, A_ref)
    _close(out, out_ref, "fallback all_gather_matmul")
    M = 4 * world
    A2 = torch.randn(M, 32, generator=gen).to(device)
    y = torch.ops.symmpool.fused_matmul_reduce_scatter(A2, B, "sum", 0, world, name)
    _close(y, _reduce_scatter_reference(A2, B, "sum", 0, group), "fallback matmul_reduce_scatter")
    z = torch.ops.symmpool.pipelined_produce_and_all_to_all(A2, B, world, name)
    _close(z, _all_to_all_reference(A2, B, group), "fallback produce_and_all_to_all")
    counts = symmpool.peer_memory_counts()
    for op in ("fused_all_gather_matmul", "fused_matmul_reduce_scatter", "pipelined_produce_and_all_to_all"):
        assert counts.get(f"{op}.fused") == 1, counts
    # The functional ops on the same group: the same synchronous calls.
    x = torch.randn(6, 5, generator=gen).to(device)
    gathered = torch.ops.symmpool.all_gather(x, world, name)
    gathered_ref = x.new_empty(world * 6, 5)
    dist.all_gather_into_tensor(gathered_ref, x, group=group)
    assert torch.equal(gathered, gathered_ref)
    rows = torch.randn(2 * world, 5, generator=gen).to(device)
    scattered_ref = rows.new_empty(2, 5)
    dist.reduce_scatter_tensor(scattered_ref, rows, group=group)
    torch.testing.assert_close(torch.ops.symmpool.reduce_scatter(rows, "sum", world, name), scattered_ref)
    summed_ref = x.clone()
    dist.all_reduce(summed_ref, group=group)
    torch.testing.assert_close(torch.ops.symmpool.all_reduce(x, "sum", name), summed_ref)
    # And on a "symm" group whose router sends plain tensors to NCCL (an
    # all-reduce over 32 KiB: smaller ones run symmpool's low-latency kernel,
    # which takes any memory).
    symm = dist.new_group(backend="cpu:gloo,cuda:symm")
    assert torch.equal(torch.ops.symmpool.all_gather(x, world, symm.group_name), gathered_ref)
    torch.testing.assert_close(torch.ops.symmpool.reduce_scatter(rows, "sum", world, symm.group_name), scattered_ref)
    big = torch.randn(129, 64, generator=gen).to(device)  # 33,024 bytes
    big_ref = big.clone()
    dist.all_reduce(big_ref, group=group)
    torch.testing.assert_close(torch.ops.symmpool.all_reduce(big, "sum", symm.group_name), big_ref)
    dist.destroy_process_group()


def peer_view_outlives_its_group(rank: int, world: int) -> None:
    """A peer_tensor view holds the mapping it reads: it stays readable after
    its group is destroyed. Before, the group's release unmapped the peer's
    segment under the view, and reading it faulted."""
    import symmpool

    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    group = dist.group.WORLD
    n = 1 << 20
    with torch.cuda.use_mem_pool(symmpool.mem_pool()):
        mine = torch.empty(n, dtype=torch.float32, device=device)
    mine.fill_(float(rank + 1))
    symmpool.rendezvous(mine, group)
    symmpool.barrier(group)  # every rank filled its buffer
    peer = (rank + 1) % world
    view = symmpool.peer_tensor(mine, peer)
    torch.cuda.synchronize()
    dist.destroy_process_group()  # the heap, and its peer mappings, go
    total = view.sum().item()
    assert total == float(peer + 1) * n, f"rank {rank} read {total} from rank {peer} after the group"
    del view  # the last holder: retired, unmapped at the next wait for the device
    torch.cuda.synchronize()
    print(f"[rank {rank}] read rank {peer}'s buffer after its group was destroyed", flush=True)


def a_group_formed_in_a_capture_leaves_retired_mappings_for_later(rank: int, world: int) -> None:
    """A peer mapping retired (its view dropped after its group went) waits
    for the next sync that may wait for the device. A group whose first
    collective is captured must not be that sync: the wait would end the
    capture. Before, forming the group inside the capture called
    cuCtxSynchronize and the capture failed."""
    import symmpool

    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    first = dist.new_group(backend="cpu:gloo,cuda:symm")
    n = 1 << 20
    with torch.cuda.use_mem_pool(symmpool.mem_pool()):
        mine = torch.empty(n, dtype=torch.float32, device=device)
    mine.fill_(float(rank + 1))
    symmpool.rendezvous(mine, first)
    symmpool.barrier(first)
    view = symmpool.peer_tensor(mine, (rank + 1) % world, first)
    torch.cuda.synchronize()
    dist.destroy_process_group(first)
    del first, view  # retired: unmapped at the next sync that may wait for the device
    assert symmpool.memory_stats(device)["retired_peer_mappings"] >= 1
    second = dist.new_group(backend="cpu:gloo,cuda:symm")
    x = second._get_backend(device).allocate_tensor(4096, dtype=torch.float32, device=device)
    x.fill_(1.0)
    before = symmpool.memory_stats(device)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        dist.all_reduce(x, group=second)  # the group's heap and communicator form here
    during = symmpool.memory_stats(device)
    assert during["symm_collectives"] == before["symm_collectives"] + 1, (before, during)
    assert during["nccl_fallbacks"] == before["nccl_fallbacks"], (before, during)
    assert during["retired_peer_mappings"] == before["retired_peer_mappings"], "a capture waited for the device"
    x.fill_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.all(x == float(world)), f"rank {rank}: {x[:4]}"
    y = second._get_backend(device).allocate_tensor(1 << 20, dtype=torch.float32, device=device)
    dist.all_reduce(y, group=second)  # eager, a new buffer: a sync that may wait, and does
    torch.cuda.synchronize()
    assert symmpool.memory_stats(device)["retired_peer_mappings"] == 0, "the retired mapping stayed"
    del graph
    dist.destroy_process_group(second)
    print(f"[rank {rank}] formed a group inside a capture with a retired peer mapping pending", flush=True)
    dist.destroy_process_group()


def peer_memory_api(rank: int, world: int, backend: str = SYMM) -> None:
    """rendezvous, peer_tensor, barrier, and signal/wait ping-pong: each rank
    reads its peers' buffers through views; a plain tensor is refused on
    every rank alike; peer_tensor before rendezvous is refused."""
    import symmpool

    device = init_group(rank, world, backend)
    group = dist.group.WORLD
    n = 4099  # odd
    pool = symmpool.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        mine = torch.empty(n, dtype=torch.float32, device=device)
    mine.fill_(float(rank + 1))
    expect_error(RuntimeError, "rendezvous", lambda: symmpool.peer_tensor(mine, (rank + 1) % world),
                  "peer_tensor before rendezvous gave a view")
    symmpool.rendezvous(mine, group)
    symmpool.barrier(group)  # every rank filled its buffer
    for peer in range(world):
        view = symmpool.peer_tensor(mine, peer)
        assert view.shape == mine.shape and view.device == mine.device
        assert torch.equal(view.clone(), torch.full_like(mine, float(peer + 1))), f"rank {rank} read peer {peer}"
    symmpool.barrier(group)

    # Ping-pong over signals: rank 0 writes round r into rank 1's buffer, signals; rank 1 checks, answers.
    if world >= 2 and rank < 2:
        other = 1 - rank
        remote = symmpool.peer_tensor(mine, other)
        for r in range(50):
            if rank == 0:
                remote.fill_(float(r))
                symmpool.signal(other)
                symmpool.wait(other)
            else:
                symmpool.wait(other)
                assert mine[0].item() == float(r) and mine[-1].item() == float(r), f"round {r}: {mine[0].item()}"
                symmpool.signal(other)
        # Counted signals: two sent before either is waited for, neither lost.
        symmpool.signal(other)
        symmpool.signal(other)
        symmpool.wait(other)
        symmpool.wait(other)
        torch.cuda.synchronize()
        _signals_replay_in_cuda_graphs(rank, other, mine, remote)
    symmpool.barrier(group)

    # A new tensor where a rendezvoused one was freed (torch's pool hands the
    # same block back) is not rendezvoused: its peers' bytes may be anything.
    torch.cuda.synchronize()
    address = mine.data_ptr()
    del view, mine
    with torch.cuda.use_mem_pool(pool):
        again = torch.empty(n, dtype=torch.float32, device=device)
    assert again.data_ptr() == address, "the pool did not reuse the block; the check below would prove nothing"
    expect_error(RuntimeError, "did not go through rendezvous",
                  lambda: symmpool.peer_tensor(again, (rank + 1) % world),
                  "peer_tensor of a new tensor at a rendezvoused address gave a view")
    symmpool.rendezvous(again, group)
    symmpool.peer_tensor(again[1:], (rank + 1) % world)  # a view of a rendezvoused storage counts

    plain = torch.empty(n, device=device)  # torch's own memory: not symmetric on any rank
    expect_error(ValueError, "not symmetric", lambda: symmpool.rendezvous(plain, group),
                  "a plain tensor passed rendezvous")
    counts = symmpool.peer_memory_counts()
    assert counts["rendezvous"] == 3 and counts["peer_tensor"] >= world, counts
    torch.cuda.synchronize()
    print(f"[rank {rank}] peer memory API: {counts}", flush=True)
    dist.destroy_process_group()


def _kernels_run(work) -> list:
    """Names of the kernels that ran on the GPU during work()."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _signals_replay_in_cuda_graphs(rank: int, other: int, mine: torch.Tensor, remote: torch.Tensor) -> None:
    """The ping-pong captured in a CUDA graph, replayed: each replay sends and
    consumes one signal each way (kernels counted on the device), and eager
    signals and waits launch no kernel (stream memory operations)."""
    import symmpool

    rounds = 6
    value = torch.zeros(1, device=mine.device)
    seen = torch.zeros(2, device=mine.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        if rank == 0:
            remote.copy_(value.expand_as(remote))
            symmpool.signal(other)
            symmpool.wait(other)
        else:
            symmpool.wait(other)
            seen.copy_(torch.stack([mine[0], mine[-1]]))
            symmpool.signal(other)
    replayed = []

    def replays():
        for r in range(rounds):
            value.fill_(float(100 + r))
            graph.replay()
            replayed.append(seen.clone())

    names = _kernels_run(replays)
    waits = sum("wait_kernel" in n for n in names)
    assert waits == rounds, f"{waits} wait kernels in {rounds} replays: {names}"
    if rank == 1:
        for r, got in enumerate(replayed):
            assert got.tolist() == [100.0 + r] * 2, f"replay {r}: rank 1 read {got.tolist()}"

    def eager_round():
        value.add_(1)  # a kernel the profiler must see, or its silence below would prove nothing
        if rank == 0:
            symmpool.signal(other)
            symmpool.wait(other)
        else:
            symmpool.wait(other)
            symmpool.signal(other)

    names = _kernels_run(eager_round)
    assert names, "the profiler saw no kernel at all in the eager round"
    assert not any("signal_kernel" in n or "wait_kernel" in n for n in names), f"eager signals ran kernels: {names}"
    del graph


def a_wait_the_gpu_has_not_reached_does_not_time_out(rank: int, world: int) -> None:
    """The wait's timeout runs from when the GPU reaches it, as a kernel's
    does. Rank 0 queues 7 s of GPU work, then signal(1) and wait(1); rank 1
    starts wait(0) only at 6 s, then answers. With a 5 s timeout counted from
    when rank 0's host queued its wait, rank 0 blamed rank 1, alive and
    waiting for rank 0's signal."""
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"  # raise, do not abort the process
    os.environ.pop("SYMMPOOL_BARRIER_TIMEOUT", None)
    import symmpool

    init_group(rank, world, "cpu:gloo,cuda:symm", timeout=datetime.timedelta(seconds=5))
    assert symmpool.is_available()
    if rank < 2:
        start = time.monotonic()
        if rank == 0:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            torch.cuda._sleep(10**8)
            end.record()
            end.synchronize()
            cycles_per_s = 10**8 / (begin.elapsed_time(end) / 1e3)
            start = time.monotonic()
            torch.cuda._sleep(int(7 * cycles_per_s))
            symmpool.signal(1)
            symmpool.wait(1)
        else:
            time.sleep(6)
            symmpool.wait(0)
            symmpool.signal(0)
        torch.cuda.synchronize()
        took = time.monotonic() - start
        assert took < 15, f"rank {rank}: the round took {took:.1f} s"
    symmpool.barrier()  # raises if a rank failed the group
    torch.cuda.synchronize()
    print(f"[rank {rank}] the late round passed without a timeout", flush=True)
    dist.destroy_process_group()


def signal_before_setup_is_refused(rank: int, world: int) -> None:
    """signal and wait are point to point: as a group's first peer-memory
    call they cannot set it up with its other ranks. Rank 0's signal is
    refused at once, by name (it used to start the group's setup alone, wait
    out the timeout, and leave the group failed); then every rank sets it up
    and the pair works."""
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    import symmpool

    init_group(rank, world, "cpu:gloo,cuda:symm", timeout=datetime.timedelta(seconds=5))
    if rank == 0:
        start = time.monotonic()
        try:
            symmpool.signal(1)
        except RuntimeError as e:
            assert "peer memory is not set up yet" in str(e), str(e)
        else:
            raise AssertionError("a signal set the group up alone")
        assert time.monotonic() - start < 1.0, time.monotonic() - start
    dist.barrier()  # gloo: both ranks past rank 0's refused signal
    assert symmpool.is_available()
    if rank == 0:
        symmpool.signal(1)
    elif rank == 1:
        symmpool.wait(0)
    symmpool.barrier()
    torch.cuda.synchronize()
    print(f"[rank {rank}] a signal before setup was refused; after it, signal and wait worked", flush=True)
    dist.destroy_process_group()


def a_wait_without_signal_times_out(rank: int, world: int) -> None:
    """Rank 1 waits for a signal rank 0 never sends: the wait gives up after
    the group's 5 s timeout and the group's next call raises, naming rank 0."""
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"  # raise, do not abort the process
    os.environ.pop("SYMMPOOL_BARRIER_TIMEOUT", None)
    import symmpool

    init_group(rank, world, "cpu:gloo,cuda:symm", timeout=datetime.timedelta(seconds=5))
    assert symmpool.is_available()
    if rank == 1:
        start = time.monotonic()
        symmpool.wait(0)
        torch.cuda.synchronize()
        waited = time.monotonic() - start
        assert 4.0 <= waited < 8.0, f"the wait gave up after {waited:.1f} s, expected about 5 s"
        try:
            symmpool.barrier()
        except RuntimeError as e:
            assert "wait #" in str(e) and "rank 0 did not arrive within 5 s" in str(e), str(e)
        else:
            raise AssertionError("the group went on after a wait timed out")
        print(f"[rank 1] the wait gave up after {waited:.1f} s", flush=True)
    else:
        time.sleep(10)
    dist.destroy_process_group()
