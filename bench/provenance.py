"""What every benchmark's results file records about the run: the code (commit,
whether the tree was clean), the machine (host, GPU model and count) and the
software (torch, NCCL, CUDA), and when (UTC). A benchmark refuses a tree whose
tracked files differ from its commit unless told (--allow-dirty, or
SYMMPOOL_BENCH_ALLOW_DIRTY=1); its results then say clean_tree: false.

    import provenance
    provenance.add_allow_dirty(parser)
    tree = provenance.require_clean_tree(args.allow_dirty)  # before measuring
    context = {**provenance.collect(state=tree), ...}

SYMMPOOL_COMMIT, where set, names the commit instead of git: the lent GPU
machines get each call's files but the first call's .git, so git there would
name a stale commit and call the tree dirty. Its value is the commit of a
clean tree, or <commit>-dirty. Nothing here needs a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMIT_ENV = "SYMMPOOL_COMMIT"
ALLOW_DIRTY_ENV = "SYMMPOOL_BENCH_ALLOW_DIRTY"
DIRTY = "-dirty"
KEYS = ("commit", "commit_source", "clean_tree", "host", "gpu", "gpus", "torch", "nccl", "cuda", "date")
VERSION_KEYS = ("gpu", "gpus", "torch", "nccl", "cuda")
MIXED = "mixed"  # a merged file's key that its runs differ on (each run's is in runs_context)


def _tree(root: str) -> tuple[dict, list[str]]:
    """(commit, commit_source, clean_tree; the modified files git lists)."""
    told = os.environ.get(COMMIT_ENV, "").strip()
    if told:
        dirty = told.endswith(DIRTY)
        return {"commit": told[:-len(DIRTY)] if dirty else told, "commit_source": COMMIT_ENV,
                "clean_tree": not dirty}, []

    def git(*args) -> str:
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        modified = git("status", "--porcelain", "--untracked-files=no").splitlines()
    except (OSError, subprocess.CalledProcessError):  # no git, or not a checkout: nothing can tell
        return {"commit": None, "commit_source": None, "clean_tree": None}, []
    return {"commit": commit, "commit_source": "git", "clean_tree": not modified}, [m[3:] for m in modified]


def tree_state(root: str = ROOT) -> dict:
    """{commit, commit_source ("SYMMPOOL_COMMIT" or "git"), clean_tree}; None
    where neither SYMMPOOL_COMMIT nor git can tell."""
    return _tree(root)[0]


def dirty_allowed(flag: bool = False) -> bool:
    return bool(flag) or os.environ.get(ALLOW_DIRTY_ENV) == "1"


def require_clean_tree(allow_dirty: bool = False, root: str = ROOT) -> dict:
    """tree_state(), after refusing (SystemExit) a tree that is dirty, or
    whose state is unknown, unless allowed."""
    state, modified = _tree(root)
    if state["clean_tree"] or dirty_allowed(allow_dirty):
        return state
    if state["clean_tree"] is None:
        why = f"{root} is not a git checkout and {COMMIT_ENV} is unset: no commit to record"
    elif state["commit_source"] == COMMIT_ENV:
        why = f"{COMMIT_ENV}={os.environ[COMMIT_ENV].strip()} says the tree had changes"
    else:
        shown = ", ".join(modified[:8]) + (f" and {len(modified) - 8} more" if len(modified) > 8 else "")
        why = f"tracked files differ from {state['commit'][:12]}: {shown}"
    raise SystemExit(f"refusing to benchmark a dirty tree ({why}). Commit first (on a copy whose .git is stale, "
                     f"set {COMMIT_ENV} to the commit its files are), or pass --allow-dirty or set "
                     f"{ALLOW_DIRTY_ENV}=1 to measure it anyway: the results then say clean_tree: false.")


def add_allow_dirty(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-dirty", action="store_true",
                        help=f"measure a tree whose tracked files differ from its commit (or {ALLOW_DIRTY_ENV}=1); "
                             "the results say clean_tree: false")


def torch_versions() -> dict:
    """{gpu, gpus, torch, nccl, cuda} as torch in this process sees them: gpu
    "none" and gpus 0 without a GPU, None for what this torch lacks. Asks
    device 0's name, which makes no CUDA context."""
    try:
        import torch
    except ImportError:
        return {"gpu": "none", "gpus": 0, "torch": None, "nccl": None, "cuda": None}
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001  (a torch built without NCCL)
        nccl = None
    return {"gpu": torch.cuda.get_device_name(0) if gpus else "none", "gpus": gpus, "torch": torch.__version__,
            "nccl": nccl, "cuda": torch.version.cuda}


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def collect(versions: dict | None = None, state: dict | None = None, root: str = ROOT) -> dict:
    """Every key of KEYS. `versions` (torch_versions() of another process,
    e.g. a child that may touch CUDA where the caller must not) and `state`
    (require_clean_tree's) are asked for here where not given."""
    state = state if state is not None else tree_state(root)
    versions = versions if versions is not None else torch_versions()
    found = {**state, "host": socket.gethostname(), **{k: versions.get(k) for k in VERSION_KEYS}, "date": now_utc()}
    return {k: found[k] for k in KEYS}


def of_context(context: dict) -> dict:
    """The KEYS of a results file's context. Files from before this module
    name the commit in symmpool_commit ("-dirty" when tracked files differed)
    and the FSDP2 bench's name the GPU model in gpu_name."""
    out = {k: context.get(k) for k in KEYS}
    old = context.get("symmpool_commit")
    if out["commit"] is None and old:
        out["commit"], out["clean_tree"] = old.removesuffix(DIRTY), not old.endswith(DIRTY)
    if "gpu_name" in context:  # its "gpu" was a short name ("h200"), or "cpu"
        out["gpu"] = context["gpu_name"] or context.get("gpu")
    return out


def merged(sources: list[tuple[str, dict]]) -> dict:
    """Provenance of a file merged from others, given (file name, context)
    of each: runs_context, every source's context (a merged source gives the
    runs_context it kept) with its file name and KEYS; and KEYS themselves,
    each the value every run shares or "mixed", clean_tree true only where
    every run's tree was clean."""
    runs = []
    for source, context in sources:
        runs += context.get("runs_context") or [{
            "source": source, **{k: v for k, v in context.items() if k not in ("merged_from", "dates")},
            **of_context(context)}]
    out = {}
    for key in KEYS:
        values = {json.dumps(r.get(key), sort_keys=True) for r in runs}
        out[key] = runs[0].get(key) if len(values) == 1 else MIXED
    trees = [r.get("clean_tree") for r in runs]
    out["clean_tree"] = False if False in trees else (True if all(t is True for t in trees) else None)
    return {**out, "runs_context": runs}
