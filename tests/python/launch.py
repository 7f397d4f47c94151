"""Starts one process per GPU for a test and fails, never hangs, past a deadline."""

from __future__ import annotations

import faulthandler
import os
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# Skip markers of the GPU tests. Where one GPU is all there is, the 2-rank
# tests run with both ranks on it (run_sharing_one_gpu): symmpool's own
# paths, with gloo's references (NCCL refuses such a group).
needs_gpu = pytest.mark.skipif(gpu_count() < 1, reason=f"needs a CUDA GPU, found {gpu_count()}")
needs_two = pytest.mark.skipif(gpu_count() < 2, reason=f"needs 2 or more CUDA GPUs, found {gpu_count()}")
one_gpu_only = pytest.mark.skipif(gpu_count() != 1, reason="2 ranks sharing the one GPU; with more GPUs the "
                                                           "2-rank tests run with a GPU per rank")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, fn, world, port, stack_dump_after, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    # A worker still running shortly before the deadline prints every thread's
    # stack, so a hang says where it hangs before it is killed.
    faulthandler.dump_traceback_later(stack_dump_after, exit=False)
    fn(rank, world, *args)
    faulthandler.cancel_dump_traceback_later()


def start_workers(fn, world: int, *args, timeout: float = 300.0):
    """Starts fn(rank, world, *args) in `world` spawned processes, each
    printing its threads' stacks shortly before `timeout`; returns the
    torch.multiprocessing context without waiting."""
    stack_dump_after = max(1.0, timeout - min(10.0, timeout / 10))
    return mp.start_processes(_entry, args=(fn, world, _free_port(), stack_dump_after, args), nprocs=world,
                              join=False, start_method="spawn")


# _free_port's port is let go before rank 0's store binds it again, and
# another process may take it in between (seen on a shared 2x H200 host:
# TCPStore's listen failed with EADDRINUSE in init_process_group). Nothing
# of the test has run then, so the start is retried on a fresh port.
START_ATTEMPTS = 3


def _store_port_taken(e: "mp.ProcessRaisedException") -> bool:
    """Rank 0 (the only rank whose store listens) failed to bind its port:
    libuv's TCPStore says EADDRINUSE, the older one errno 98."""
    text = str(e)
    return (e.error_index == 0 and ("failed to listen" in text or "failed to bind" in text)
            and ("EADDRINUSE" in text or "errno: 98" in text))


def run_workers(fn, world: int, *args, timeout: float = 300.0) -> None:
    """Runs fn(rank, world, *args) in `world` spawned processes; re-raises a
    worker's exception; kills them all and raises TimeoutError past `timeout`.
    A start whose store found its port taken is retried (START_ATTEMPTS in all)."""
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            return _run_workers_once(fn, world, *args, timeout=timeout)
        except mp.ProcessRaisedException as e:
            if not _store_port_taken(e) or attempt == START_ATTEMPTS:
                raise
            print(f"launch: rank 0's store port was taken (attempt {attempt} of {START_ATTEMPTS}), "
                  "starting the workers again on another port")


def _run_workers_once(fn, world: int, *args, timeout: float) -> None:
    ctx = start_workers(fn, world, *args, timeout=timeout)
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.0, min(5.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"workers still running after {timeout:.0f} s")


def _sharing_one_gpu(rank, world, fn, *args):
    os.environ["SYMMPOOL_TEST_RANKS_SHARE_GPU"] = "1"
    fn(rank, world, *args)


def run_sharing_one_gpu(fn, world: int, *args, timeout: float = 300.0) -> None:
    """run_workers with every rank on GPU 0 (SYMMPOOL_TEST_RANKS_SHARE_GPU=1):
    symmpool's own multi-rank paths on a 1-GPU machine. NCCL refuses such a
    group, so the workers take their references from gloo instead
    (dist_common.ranks_share_gpu)."""
    run_workers(_sharing_one_gpu, world, fn, *args, timeout=timeout)
