"""bench/provenance.py without a GPU: what every benchmark's results file
records about its run, the refusal of a dirty tree and its override,
SYMMPOOL_COMMIT winning over a stale .git, and a merged FSDP2 file keeping
each run's context. (bench/bench_context.cpp does the same for the C++
benches.)"""

import argparse
import datetime
import json
import pathlib
import socket
import subprocess
import sys

import pytest
import torch

import test_peers_bench
import test_tp_ops_bench
from test_peers_bench import help_text, load_bench

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "bench"))
import provenance  # noqa: E402

FSDP2 = load_bench([ROOT / "bench" / "fsdp2"], ("run", "aggregate", "configs", "host_meter"))["run"]
# Every script that writes a results file.
SCRIPTS = ("bench/fsdp2/run.py", "bench/peers/run.py", "bench/tp_ops/run.py", "bench/tp_ops/split_cost.py",
           "bench/host_time.py", "bench/host_layers.py", "bench/collectives_host_cost.py",
           "bench/window_registration.py")


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git checkout of one committed file, with neither variable set:
    (its directory, its HEAD)."""
    monkeypatch.delenv("SYMMPOOL_COMMIT", raising=False)
    monkeypatch.delenv("SYMMPOOL_BENCH_ALLOW_DIRTY", raising=False)  # conftest.py allows dirty trees

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", "commit", "-qm", "one")
    return tmp_path, git("rev-parse", "HEAD")


def test_the_record_has_every_key(repo):
    root, head = repo
    p = provenance.collect(root=str(root))
    assert tuple(p) == provenance.KEYS
    assert (p["commit"], p["commit_source"], p["clean_tree"]) == (head, "git", True)
    assert p["host"] == socket.gethostname() and p["torch"] == torch.__version__ and p["cuda"] == torch.version.cuda
    assert isinstance(p["gpus"], int) and (p["gpu"] == "none") == (p["gpus"] == 0)
    assert datetime.datetime.fromisoformat(p["date"]).utcoffset() == datetime.timedelta(0)  # UTC
    json.dumps(p)  # goes into the JSON as it is


def test_no_gpu_and_no_torch_still_give_every_key(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    versions = provenance.torch_versions()
    assert (versions["gpu"], versions["gpus"], versions["torch"]) == ("none", 0, torch.__version__)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert provenance.torch_versions() == {"gpu": "none", "gpus": 0, "torch": None, "nccl": None, "cuda": None}


def test_a_dirty_tree_is_refused_unless_allowed_and_then_marked(repo, monkeypatch):
    root, head = repo
    (root / "untracked.txt").write_text("not a change to the code\n")
    assert provenance.require_clean_tree(root=str(root))["clean_tree"] is True  # untracked files do not count
    (root / "a.txt").write_text("two\n")
    with pytest.raises(SystemExit, match=r"refusing to benchmark a dirty tree \(tracked files differ from "
                                         rf"{head[:12]}: a.txt\).*--allow-dirty.*SYMMPOOL_BENCH_ALLOW_DIRTY=1"):
        provenance.require_clean_tree(root=str(root))
    state = provenance.require_clean_tree(True, root=str(root))
    assert state == {"commit": head, "commit_source": "git", "clean_tree": False}
    assert provenance.collect(state=state)["clean_tree"] is False
    monkeypatch.setenv("SYMMPOOL_BENCH_ALLOW_DIRTY", "1")
    assert provenance.require_clean_tree(root=str(root))["clean_tree"] is False


def test_a_tree_with_no_commit_to_record_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("SYMMPOOL_COMMIT", raising=False)
    monkeypatch.delenv("SYMMPOOL_BENCH_ALLOW_DIRTY", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no checkout above it either
    assert provenance.tree_state(str(tmp_path)) == {"commit": None, "commit_source": None, "clean_tree": None}
    with pytest.raises(SystemExit, match="not a git checkout"):
        provenance.require_clean_tree(root=str(tmp_path))


def test_symmpool_commit_wins_over_git(repo, monkeypatch):
    """A lent GPU machine gets each call's files but the first call's .git:
    the caller names the commit the files are."""
    root, _ = repo
    (root / "a.txt").write_text("what a stale .git sees as a change\n")
    monkeypatch.setenv("SYMMPOOL_COMMIT", "0123abc")
    state = provenance.require_clean_tree(root=str(root))
    assert state == {"commit": "0123abc", "commit_source": "SYMMPOOL_COMMIT", "clean_tree": True}
    monkeypatch.setenv("SYMMPOOL_COMMIT", "0123abc-dirty")
    assert provenance.tree_state(str(root)) == {"commit": "0123abc", "commit_source": "SYMMPOOL_COMMIT",
                                                "clean_tree": False}
    with pytest.raises(SystemExit, match="SYMMPOOL_COMMIT=0123abc-dirty says the tree had changes"):
        provenance.require_clean_tree(root=str(root))


def test_allow_dirty_is_a_flag_of_every_bench():
    p = argparse.ArgumentParser()
    provenance.add_allow_dirty(p)
    assert p.parse_args(["--allow-dirty"]).allow_dirty and not p.parse_args([]).allow_dirty
    assert FSDP2.parse_args(["--allow-dirty"]).allow_dirty
    assert test_peers_bench.run.parse_args(["--allow-dirty"]).allow_dirty
    assert test_tp_ops_bench.run.parse_args(["--allow-dirty"]).allow_dirty
    for script in SCRIPTS[3:]:  # the others: imported above
        assert "--allow-dirty" in help_text(ROOT / script), script


def test_a_bench_refuses_a_dirty_tree_before_it_runs_anything(monkeypatch):
    monkeypatch.delenv("SYMMPOOL_BENCH_ALLOW_DIRTY", raising=False)
    monkeypatch.setenv("SYMMPOOL_COMMIT", "0123abc-dirty")
    proc = subprocess.run([sys.executable, str(ROOT / "bench/fsdp2/run.py"), "--device", "cpu", "--modes", "stock",
                           "--configs", "tiny-b1s8", "--out", "/nonexistent/never-written.json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "refusing to benchmark a dirty tree" in proc.stderr, proc.stderr


def test_peer_and_tp_contexts_hold_the_provenance(monkeypatch):
    monkeypatch.setenv("SYMMPOOL_COMMIT", "0123abc")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    device = torch.device("cuda", 0)
    for run in (test_peers_bench.run, test_tp_ops_bench.run):
        ctx = run.context_of(run.parse_args([]), 2, device)
        assert set(provenance.KEYS) <= set(ctx) and ctx["commit_source"] == "SYMMPOOL_COMMIT", run.__file__
        assert ctx["gpu"] == "NVIDIA H200" and "symmpool_commit" not in ctx


def fsdp2_file(path, **context):
    base = {"gpu": "NVIDIA H200", "ranks": 2, "device": "cuda", "commit": "a" * 40, "commit_source": "git",
            "clean_tree": True, "host": "host-a", "gpus": 2, "torch": "2.11.0", "nccl": "2.28.9", "cuda": "13.0",
            "date": "2026-11-29T10:00:00+00:00"}
    FSDP2.write_json(str(path), FSDP2.document(dict(base, **context), [], []))
    return str(path)


def test_a_merged_fsdp2_file_keeps_each_runs_context(tmp_path):
    a = fsdp2_file(tmp_path / "a.json", env={"GLIBC_TUNABLES": None})
    same = fsdp2_file(tmp_path / "same.json", date="2026-11-29T11:00:00+00:00")
    ctx = FSDP2.merge([a, same], str(tmp_path / "m0.json"))["context"]
    assert (ctx["commit"], ctx["clean_tree"], ctx["host"], ctx["date"]) == ("a" * 40, True, "host-a", provenance.MIXED)

    b = fsdp2_file(tmp_path / "b.json", commit="b" * 40, clean_tree=False, host="host-b",
                   date="2026-11-30T09:00:00+00:00")
    merged = FSDP2.merge([a, b], str(tmp_path / "m.json"))
    ctx = json.loads((tmp_path / "m.json").read_text())["context"]
    assert ctx == merged["context"]
    assert [(r["source"], r["commit"], r["clean_tree"], r["host"], r["date"]) for r in ctx["runs_context"]] == [
        ("a.json", "a" * 40, True, "host-a", "2026-11-29T10:00:00+00:00"),
        ("b.json", "b" * 40, False, "host-b", "2026-11-30T09:00:00+00:00")]
    assert ctx["runs_context"][0]["env"] == {"GLIBC_TUNABLES": None}  # the whole context, not only provenance
    # The file itself says it spans commits and hosts, and that one tree was dirty.
    assert (ctx["commit"], ctx["host"], ctx["clean_tree"], ctx["gpu"]) == ("mixed", "mixed", False, "NVIDIA H200")

    # A file from before bench/provenance.py: the commit in symmpool_commit, the model in gpu_name.
    old = fsdp2_file(tmp_path / "old.json", gpu="h200", gpu_name="NVIDIA H200", symmpool_commit="c" * 40 + "-dirty",
                     commit=None, commit_source=None, clean_tree=None, host="host-c")
    again = FSDP2.merge([str(tmp_path / "m.json"), old], str(tmp_path / "m2.json"))["context"]
    assert [r["source"] for r in again["runs_context"]] == ["a.json", "b.json", "old.json"]  # merges flatten
    assert {k: again["runs_context"][2][k] for k in ("commit", "clean_tree", "gpu")} == {
        "commit": "c" * 40, "clean_tree": False, "gpu": "NVIDIA H200"}
    assert again["merged_from"] == ["a.json", "b.json", "old.json"]
