"""Bodies of the multi-GPU tests of failures: a peer that dies, buffers that
are not symmetric (one call per rank, see launch.py)."""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

from dist_common import expect_error, host_barrier, init_group

TIMEOUT_S = 5


def _symm_group(rank: int, world: int, error_handling: str, blocking_wait: bool = False):
    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    os.environ.pop("SYMMPOOL_BARRIER_TIMEOUT", None)
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = error_handling
    os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1" if blocking_wait else "0"
    import symmpool  # noqa: F401  (registers the backend)

    device = init_group(rank, world, "cpu:gloo,cuda:symm", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    backend = dist.group.WORLD._get_backend(device)
    buf = backend.allocate_tensor(4096, dtype=torch.float32, device=device)
    buf.fill_(1.0)
    dist.all_reduce(buf)  # every rank: heap and communicator
    torch.cuda.synchronize()
    assert buf[0].item() == world
    host_barrier()
    return device, backend, buf


def _expect_failure_named(text: str, missing: int) -> None:
    assert f"rank {missing} did not arrive within {TIMEOUT_S} s" in text, text
    assert "all_reduce #" in text, text


def dead_peer_raises_on_every_survivor(rank: int, world: int, blocking_wait: bool) -> None:
    """Rank world-1 dies after setup. With TORCH_NCCL_ASYNC_ERROR_HANDLING=0 each
    survivor's all-reduces fail within the timeout + 1 s, the Works report it,
    and every later collective (symmpool's or NCCL's) raises at once."""
    device, backend, buf = _symm_group(rank, world, "0", blocking_wait)
    dead = world - 1
    if rank == dead:
        os._exit(0)  # dies without a word
    start = time.monotonic()
    if blocking_wait:
        try:
            dist.all_reduce(buf)  # wait() blocks the host and raises
        except RuntimeError as e:
            _expect_failure_named(str(e), dead)
        else:
            raise AssertionError("a blocking all-reduce without its peer returned")
    else:
        works = [dist.all_reduce(buf, async_op=True) for _ in range(3)]
        torch.cuda.synchronize()  # the first gives up, the two behind it drain
        waited = time.monotonic() - start
        assert waited <= TIMEOUT_S + 1, f"the survivor waited {waited:.1f} s"
        for w in works:  # (Work.exception() has no Python binding in torch 2.11)
            assert w.is_completed() and not w.is_success()
            try:
                w.wait()
            except RuntimeError as e:
                _expect_failure_named(str(e), dead)
            else:
                raise AssertionError("wait() on a failed all-reduce returned")
    waited = time.monotonic() - start
    assert waited <= TIMEOUT_S + 1, f"the error came after {waited:.1f} s"
    print(f"[rank {rank}] dead rank {dead} reported after {waited:.2f} s", flush=True)
    plain = torch.ones(8, device=device)  # would go to NCCL: the group is failed all the same
    for t in (buf, plain):
        begin = time.monotonic()
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            _expect_failure_named(str(e), dead)
        else:
            raise AssertionError("a collective on a failed group returned")
        assert time.monotonic() - begin < 0.5
    sys.stdout.flush()
    os._exit(0)  # NCCL's teardown with a dead peer is not ours to test


def dead_peer_aborts_by_default(rank: int, world: int, log_dir: str) -> None:
    """As ProcessGroupNCCL with the default TORCH_NCCL_ASYNC_ERROR_HANDLING (3):
    a survivor's failed collective tears its process down, after saying
    which rank never came. Stderr goes to a file the test reads."""
    fd = os.open(os.path.join(log_dir, f"rank{rank}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.environ.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING", None)
    _, _, buf = _symm_group(rank, world, "3")
    os.environ.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING", None)
    if rank == world - 1:
        os._exit(0)
    with open(os.path.join(log_dir, f"rank{rank}.start"), "w") as f:
        f.write(repr(time.time()))
    dist.all_reduce(buf)
    torch.cuda.synchronize()
    print(f"[rank {rank}] read {buf[0].item()} after a failed all-reduce", flush=True)
    os._exit(0)  # must not be reached: the process is aborted before the stream goes on


def abort_with_nccl_stuck_on_a_dead_peer(rank: int, world: int) -> None:
    """A survivor whose NCCL collective waits for a dead peer aborts the group
    within seconds. Before NCCL's abort went first, symmpool's release waited
    for the device, that is for the stuck NCCL kernel: forever."""
    import threading

    device, backend, _ = _symm_group(rank, world, "0")
    plain = torch.ones(1 << 20, device=device)  # not symmpool's: NCCL runs it
    dist.all_reduce(plain)  # NCCL's communicator forms on every rank
    torch.cuda.synchronize()
    host_barrier()
    if rank == world - 1:
        os._exit(0)
    work = dist.all_reduce(plain, async_op=True)
    time.sleep(1.0)
    assert not work.is_completed(), "NCCL finished an all-reduce without its peer: nothing is stuck to test"
    done, errors = threading.Event(), []

    def abort() -> None:
        try:
            backend.abort()
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)
        done.set()

    start = time.monotonic()
    threading.Thread(target=abort, daemon=True).start()
    if not done.wait(60):
        print(f"[rank {rank}] abort still waiting after 60 s", flush=True)
        os._exit(3)
    assert not errors, errors
    print(f"[rank {rank}] abort returned after {time.monotonic() - start:.2f} s", flush=True)
    os._exit(0)  # NCCL's teardown with a dead peer is not ours to test


def a_communicator_the_watchdog_aborted_is_left_alone(rank: int, world: int) -> None:
    """With TORCH_NCCL_ASYNC_ERROR_HANDLING=2 ProcessGroupNCCL's watchdog
    aborts a timed-out NCCL communicator itself (NCCLComm::abort, not the
    backend's abort()). symmpool's registration hooks must not call NCCL on
    it afterwards: a registered segment released then is not deregistered
    (its registration counts as abandoned), a new one is not registered.
    Before, they called ncclCommDeregister/Register on the freed communicator."""
    # The watchdog aborts 4 x this many ms after the timeout (60 s by default),
    # and no dump or monitor may kill the process meanwhile.
    os.environ["TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"] = "100"
    os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "0"
    os.environ["TORCH_NCCL_ENABLE_MONITORING"] = "0"
    import symmpool

    device, backend, buf = _symm_group(rank, world, "2")
    # The stuck rank waits on this (gloo) until the others are done: NCCL's
    # barrier dies with the communicator, and the default group times out in 5 s.
    done = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=120))
    plain = torch.ones(1 << 20, device=device)  # not symmpool's: NCCL runs it
    dist.all_reduce(plain)  # NCCL's communicator forms
    pre = backend.allocate_tensor(64 << 20, dtype=torch.uint8, device=device)  # the hook comes: registered
    before = symmpool.memory_stats(device)
    assert before["nccl_registered_segments"] > 0, before
    torch.cuda.synchronize()
    host_barrier()
    stuck = world - 1
    if rank != stuck:
        work = dist.all_reduce(plain, async_op=True)  # the stuck rank never joins: the watchdog times it out
        deadline = time.monotonic() + 60
        while True:  # enqueue nothing more: poll the communicator until the watchdog aborted it
            try:
                backend._comm_ptr()
            except RuntimeError as e:
                assert "aborted" in str(e), str(e)
                break
            assert time.monotonic() < deadline, f"rank {rank}: the watchdog did not abort within 60 s"
            time.sleep(0.2)
        expect_error(RuntimeError, "aborted", lambda: dist.all_reduce(plain),
                     "a collective on the aborted communicator went through")
        del pre
        symmpool.empty_cache(device)  # unmaps the registered segment: no deregistration now
        mid = symmpool.memory_stats(device)
        assert mid["nccl_deregistrations"] == before["nccl_deregistrations"], (before, mid)
        assert mid["nccl_abandoned_registrations"] > before["nccl_abandoned_registrations"], (before, mid)
        big = backend.allocate_tensor(96 << 20, dtype=torch.uint8, device=device)  # a new segment
        after = symmpool.memory_stats(device)
        assert after["segment_maps"] > mid["segment_maps"], (mid, after)
        assert after["nccl_registrations"] == before["nccl_registrations"], (before, after)
        del big, work
        print(f"[rank {rank}] left the aborted communicator alone: "
              f"{after['nccl_abandoned_registrations']} registrations abandoned", flush=True)
    dist.barrier(group=done)  # the stuck rank stays alive until the others are done
    os._exit(0)  # NCCL's teardown after an abort is not ours to test


def asymmetric_user_allocation_keeps_collectives_correct(rank: int, world: int) -> None:
    """Rank 0 allocates 96 MiB more than the others before the group's first
    collective. symmpool's own buffers do not move (internal slots), buffers
    at different offsets go to NCCL on every rank, and once the ranks'
    allocations line up again, collectives run on symmpool; every result
    equals NCCL's."""
    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    import symmpool

    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    backend = dist.group.WORLD._get_backend(device)
    reference = dist.new_group(backend="nccl")  # expected results, outside the counted group
    extra = [backend.allocate_tensor(96 << 20, dtype=torch.uint8, device=device)] if rank == 0 else []
    gen = torch.Generator().manual_seed(99 + rank)

    def check_round(n: int) -> None:
        x = torch.randint(-8, 9, (n * world,), generator=gen).to(torch.bfloat16).to(device)
        expected_ag = torch.empty(n * world * world, dtype=x.dtype, device=device)
        dist.all_gather_into_tensor(expected_ag, x, group=reference)
        expected_ar = x.clone()
        dist.all_reduce(expected_ar, group=reference)
        inp = backend.allocate_tensor(n * world, dtype=x.dtype, device=device)
        out = backend.allocate_tensor(n * world * world, dtype=x.dtype, device=device)
        inp.copy_(x)
        out.fill_(float("nan"))
        dist.all_gather_into_tensor(out, inp)
        assert torch.equal(out, expected_ag), f"all-gather differs on rank {rank}"
        dist.all_reduce(inp)
        assert torch.equal(inp, expected_ar), f"all-reduce differs on rank {rank}"

    def counts():
        s = symmpool.memory_stats(device)
        return s["symm_collectives"], s["nccl_fallbacks"]

    routed0, fallbacks0 = counts()
    check_round(100_003)  # rank 0's buffers sit 96 MiB higher: NCCL, every rank
    routed1, fallbacks1 = counts()
    assert fallbacks1 - fallbacks0 >= 2 and routed1 - routed0 == 0, (routed0, fallbacks0, routed1, fallbacks1)
    if rank != 0:  # mapped by the other ranks alone: synced with rank 0 at the next check
        extra.append(backend.allocate_tensor(96 << 20, dtype=torch.uint8, device=device))
    check_round(3_000_017)  # new large segments at the same offset on every rank: symmpool
    routed2, fallbacks2 = counts()
    assert routed2 - routed1 >= 2 and fallbacks2 == fallbacks1, (routed1, fallbacks1, routed2, fallbacks2)
    print(f"[rank {rank}] asymmetric: {fallbacks1 - fallbacks0} on NCCL; aligned: {routed2 - routed1} on symmpool",
          flush=True)
    torch.cuda.synchronize()
    dist.destroy_process_group()


def wait_with_a_timeout_blocks_the_host(rank: int, world: int) -> None:
    """Work.wait(timeout) blocks the host until the collective ends, as
    ProcessGroupNCCL's does: with a late peer it returns only once the
    all-reduce is done, and raises, naming the call, where the timeout is
    shorter than the peer's delay. (It once returned at once, done or not.)"""
    device, backend, buf = _symm_group(rank, world, "0")
    late = world - 1
    for timeout_s, delay_s, ok in ((30, 2.0, True), (1, 3.0, False)):
        host_barrier()
        if rank == late:
            time.sleep(delay_s)
        buf.fill_(1.0)
        work = dist.all_reduce(buf, async_op=True)
        start = time.monotonic()
        try:
            work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        except RuntimeError as e:
            assert not ok and rank != late, f"rank {rank}: wait({timeout_s} s) raised: {e}"
            assert "did not finish within 1000 ms" in str(e) and "allreduce #" in str(e).lower(), str(e)
            assert time.monotonic() - start < 2.0, time.monotonic() - start
        else:
            assert ok or rank == late, f"rank {rank}: wait(1 s) returned with its peer {delay_s} s late"
            assert work.is_completed(), f"rank {rank}: wait({timeout_s} s) returned before the work ended"
            assert buf[0].item() == world
        torch.cuda.synchronize()  # the late peer came: the all-reduce ends either way
    print(f"[rank {rank}] wait(timeout) blocked until the end, and raised past it", flush=True)
    host_barrier()
    dist.destroy_process_group()


def plain_tensor_on_one_rank_fails_loudly(rank: int, world: int) -> None:
    """Not SPMD: rank 0 all-reduces a plain tensor (its call goes to NCCL,
    decided locally) while the others all-reduce a symmpool tensor, then rank
    0 all-reduces the symmpool tensor. No rank may pair two different calls:
    every rank raises within the timeout + 1 s, and nobody reads a result."""
    import symmpool

    device, backend, buf = _symm_group(rank, world, "0")
    start = time.monotonic()
    try:
        if rank == 0:
            # NCCL (plain, and twice low-latency's limit in fp32): its peers never come
            dist.all_reduce(torch.ones(symmpool._C.LOW_LATENCY_MAX_BYTES // 2, device=device), async_op=True)
        works = [dist.all_reduce(buf, async_op=True)]
        torch.cuda.synchronize()
        works.append(dist.all_reduce(buf, async_op=True))
        for w in works:
            w.wait()
    except RuntimeError as e:
        text = str(e)
        assert "all_reduce #" in text and ("did not arrive" in text or "never arrived" in text), text
    else:
        raise AssertionError(f"rank {rank}: calls that differ between ranks went through")
    waited = time.monotonic() - start
    assert waited <= TIMEOUT_S + 1.5, f"rank {rank} raised after {waited:.1f} s"
    print(f"[rank {rank}] the ranks' differing calls raised after {waited:.2f} s", flush=True)
    sys.stdout.flush()
    os._exit(0)  # rank 0's NCCL all-reduce never completes: its teardown is not ours to test


def tensors_on_two_devices_are_refused(rank: int, world: int) -> None:
    """An all-gather or reduce-scatter whose output is on another GPU than its
    input raises, naming both devices, on every rank (before any peer is
    involved), and the group keeps working."""
    device, backend, buf = _symm_group(rank, world, "0")
    other = torch.device("cuda", (device.index + 1) % torch.cuda.device_count())
    inp = backend.allocate_tensor(1024, dtype=torch.float32, device=device)
    for op in ("all_gather", "reduce_scatter"):
        out_numel = 1024 * world if op == "all_gather" else 1024 // world
        out = torch.empty(out_numel, device=other)
        try:
            if op == "all_gather":
                dist.all_gather_into_tensor(out, inp)
            else:
                dist.reduce_scatter_tensor(out, inp)
        except RuntimeError as e:
            assert str(device) in str(e) and str(other) in str(e), str(e)
        else:
            raise AssertionError(f"{op} with output on {other} and input on {device} went through")
    buf.fill_(1.0)
    dist.all_reduce(buf)
    torch.cuda.synchronize()
    assert buf[0].item() == world
    dist.destroy_process_group()


# Per case: each rank's variables, then what both ranks' errors must say.
DIFFERING_SETTINGS = {
    # Ranks that prefer different algorithms would meet in different places.
    "preferences": (
        [{"SYMMPOOL_ALL_REDUCE_ALGORITHM": "two-step"}, {}],
        ["SYMMPOOL_ALL_REDUCE_ALGORITHM", "'all_reduce two-step, reduce_scatter table, two-step pieces of",
         "'all_reduce table, reduce_scatter table, two-step pieces of"]),
    # Two-step calls cut into other pieces would pair one piece with another.
    "pieces": (
        [{"SYMMPOOL_TWO_STEP_PIECE_BYTES": "65536"}, {}],
        ["SYMMPOOL_TWO_STEP_PIECE_BYTES", "two-step pieces of 65536 bytes,", "two-step pieces of 33554432 bytes,"]),
    # One rank's reduction kernel meeting inside while the other's runs
    # between barrier kernels would wait for signals on other rows.
    "fused": (
        [{"SYMMPOOL_FUSED_MAX_BYTES": "1048576"}, {}],
        ["SYMMPOOL_FUSED_MAX_BYTES", "reductions fused up to 1048576 bytes a peer' on rank 0",
         "reductions fused at every size' on rank 1"]),
    # A call one rank sends to NCCL and the other runs here would wait for
    # each other in vain.
    "routing": (
        [{"SYMMPOOL_COLLECTIVES": "always"}, {"SYMMPOOL_COLLECTIVES": ""}],
        ["SYMMPOOL_COLLECTIVES is", "'always' on rank 0", "'table' on rank 1"]),
}
_SETTINGS = ("SYMMPOOL_ALL_REDUCE_ALGORITHM", "SYMMPOOL_REDUCE_SCATTER_ALGORITHM", "SYMMPOOL_TWO_STEP_PIECE_BYTES",
             "SYMMPOOL_FUSED_MAX_BYTES")


def differing_settings_fail_to_form(rank: int, world: int, case: str) -> None:
    """Ranks whose settings would route or cut a call differently: instead
    of waiting out the timeout, the group's first symmpool collective fails
    on every rank at once, naming the setting and both values ("every rank
    must set it alike"), and stays failed."""
    import symmpool  # noqa: F401  (registers the backend)

    per_rank, expected = DIFFERING_SETTINGS[case]
    os.environ["SYMMPOOL_COLLECTIVES"] = "always"
    for name in _SETTINGS:
        os.environ.pop(name, None)
    for name, value in per_rank[min(rank, 1)].items():
        if value:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
    device = init_group(rank, world, "cpu:gloo,cuda:symm")
    backend = dist.group.WORLD._get_backend(device)
    t = backend.allocate_tensor(1024, dtype=torch.float32, device=device)  # 4 KiB: the table takes it
    start = time.monotonic()
    expect_error(Exception, expected + ["every rank must set it alike"], lambda: dist.all_reduce(t),
                 f"rank {rank}: differing settings ({case}) formed a group")
    assert time.monotonic() - start < 30, "the mismatch was found only after a timeout"
    expect_error(Exception, "every rank must set it alike", lambda: dist.all_reduce(t),
                 f"rank {rank}: a failed group ran a collective")
    print(f"[rank {rank}] differing settings ({case}) refused by name", flush=True)
    dist.destroy_process_group()
