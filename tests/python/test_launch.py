"""The test launcher on CPU: every rank runs with the arguments given, a
worker's exception reaches the test, and a hang ends at the deadline. (The
dead-peer abort test once passed its workers one argument too few, and
they died at spawn where only a GPU machine could see it.)"""

import os
import time

import pytest
from launch import run_workers, start_workers


def _write_rank(rank: int, world: int, directory: str, word: str) -> None:
    with open(os.path.join(directory, f"rank{rank}"), "w") as f:
        f.write(f"{word} {rank}/{world} {os.environ['RANK']}")


def _fail_on_rank_one(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 says no")


def _sleep(rank: int, world: int) -> None:
    time.sleep(60)


def test_start_workers_passes_every_argument(tmp_path):
    ctx = start_workers(_write_rank, 2, str(tmp_path), "hello", timeout=60)
    deadline = time.monotonic() + 60
    while not ctx.join(timeout=5):  # True once every process has ended
        assert time.monotonic() < deadline, "workers still running"
    assert [p.exitcode for p in ctx.processes] == [0, 0]
    assert sorted((tmp_path / f"rank{r}").read_text() for r in range(2)) == ["hello 0/2 0", "hello 1/2 1"]


def test_run_workers_reraises_a_worker_exception():
    with pytest.raises(Exception, match="rank 1 says no"):
        run_workers(_fail_on_rank_one, 2, timeout=60)


def test_run_workers_stops_a_hang_at_the_deadline():
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="still running after 3 s"):
        run_workers(_sleep, 2, timeout=3)
    assert time.monotonic() - began < 30
