"""bench/allocator_workload.py's trace recorder without a GPU: torch's
memory-history entries become the lines bench/allocator_replay.cpp reads,
and the gzipped file holds them all."""

import gzip
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import allocator_workload  # noqa: E402


def entry(action, addr=0, size=0, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0}


def test_history_entries_become_replay_lines():
    entries = [entry("segment_alloc", 1 << 40, 20 << 20), entry("alloc", 1 << 40, 4096, 7),
               entry("free_requested", 1 << 40, 4096, 7), entry("free_completed", 1 << 40, 4096, 7),
               entry("segment_map", 2 << 40, 2 << 20), entry("segment_unmap", 2 << 40, 2 << 20),
               entry("segment_free", 1 << 40, 20 << 20), entry("snapshot"), entry("oom", size=1)]
    assert allocator_workload.trace_lines(entries) == [
        f"s {20 << 20}", f"a {1 << 40} 4096 7", f"f {1 << 40}", f"s {2 << 20}", f"S {2 << 20}", f"S {20 << 20}"]


def test_the_trace_file_is_gzipped_where_its_name_says(tmp_path):
    path = tmp_path / "trace.txt.gz"
    snapshot = {"device_traces": [[entry("alloc", 512, 512, 0), entry("free_requested", 512, 512, 0)]]}
    allocator_workload.write_trace(snapshot, str(path))
    lines = gzip.open(path, "rt").read().splitlines()
    assert lines[0].startswith("#")
    assert lines[1:] == ["a 512 512 0", "f 512"]


def test_a_history_that_lost_its_start_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(allocator_workload, "TRACE_ENTRIES", 2)
    snapshot = {"device_traces": [[entry("alloc", 512, 512, 0), entry("free_requested", 512, 512, 0)]]}
    with pytest.raises(SystemExit, match="last 2 entries"):
        allocator_workload.write_trace(snapshot, str(tmp_path / "trace.txt"))
