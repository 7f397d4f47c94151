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


def _port_taken_at_first(rank: int, world: int, directory: str, starts_failing: int) -> None:
    """Fails as TCPStore does when its port was taken, in the first
    `starts_failing` starts; counts every start on rank 0."""
    starts = os.path.join(directory, "starts")
    if rank == 0:
        with open(starts, "a") as f:
            f.write("x")
        if len(open(starts).read()) <= starts_failing:
            raise RuntimeError("The server socket has failed to listen on any local network address. "
                               "port: 52863, useIpv6: false, code: -98, name: EADDRINUSE, message: "
                               "address already in use")


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


def test_run_workers_starts_again_where_the_store_port_was_taken(tmp_path):
    """The race of a port let go and bound again, lost once: the test runs on the next start."""
    run_workers(_port_taken_at_first, 2, str(tmp_path), 1, timeout=60)
    assert (tmp_path / "starts").read_text() == "xx"


def test_run_workers_gives_up_on_a_port_taken_every_time(tmp_path):
    with pytest.raises(Exception, match="EADDRINUSE"):
        run_workers(_port_taken_at_first, 2, str(tmp_path), 99, timeout=60)
    assert (tmp_path / "starts").read_text() == "xxx"


def _count_and_fail(rank: int, world: int, directory: str) -> None:
    if rank == 0:
        with open(os.path.join(directory, "starts"), "a") as f:
            f.write("x")
        raise ValueError("address already in use, but not the store's: EADDRINUSE")


def _legacy_port_taken_once(rank: int, world: int, directory: str) -> None:
    """As the TCPStore without libuv (USE_LIBUV=0) says it, once."""
    starts = os.path.join(directory, "starts")
    if rank == 0:
        with open(starts, "a") as f:
            f.write("x")
        if len(open(starts).read()) == 1:
            raise RuntimeError("The server socket has failed to bind to [::]:52863 (errno: 98 - Address already "
                               "in use).")


def test_run_workers_starts_again_after_the_legacy_stores_port_error(tmp_path):
    run_workers(_legacy_port_taken_once, 2, str(tmp_path), timeout=60)
    assert (tmp_path / "starts").read_text() == "xx"


def _port_taken_on_rank_one(rank: int, world: int, directory: str) -> None:
    if rank == 1:
        with open(os.path.join(directory, "starts"), "a") as f:
            f.write("x")
        raise RuntimeError("The server socket has failed to listen on any local network address. "
                           "code: -98, name: EADDRINUSE")


def test_run_workers_starts_again_only_for_rank_zeros_store(tmp_path):
    """Only rank 0's store listens: the same words from another rank are a failure of the test."""
    with pytest.raises(Exception, match="EADDRINUSE"):
        run_workers(_port_taken_on_rank_one, 2, str(tmp_path), timeout=60)
    assert (tmp_path / "starts").read_text() == "x"


def test_run_workers_does_not_start_again_after_other_errors(tmp_path):
    with pytest.raises(Exception, match="not the store's"):
        run_workers(_count_and_fail, 2, str(tmp_path), timeout=60)
    assert (tmp_path / "starts").read_text() == "x"
