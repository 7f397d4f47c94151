"""FSDP2 memory and loss regression, on every visible GPU (2 or more): a
mid-size Llama-style model trains a few steps in stock and in every "symm"
mode, each in its own process (bench/fsdp2/run.py), and issue 13's bounds
must hold:
  * device peak (mem_get_info, max over ranks) of symm, symm-always,
    symm-nccl and symm-hooks (a plain "nccl" job with symmpool.fsdp.enable)
    <= stock + 2%, of symm-noflag <= stock + 1%;
  * with deterministic kernels (--deterministic: attention as plain matmuls,
    deterministic cuBLAS), stock against stock is bit-equal, and so is every
    mode against stock on 2 ranks (a sum of two fp32 values does not depend
    on the order NCCL or symmpool adds them in); on more ranks the order
    may differ, and every step's loss must be within 1e-5 relative.
symm-nccl once failed its bound here (+5.8%, 4.97 against 4.69 GiB on 2x
H200): its reduce-scatter inputs sat in symmpool's pool instead of riding
on torch's freed activations (docs/fsdp2_flag_memory.md); with
SYMMPOOL_COLLECTIVES=0 the default stream's requests now come from torch.
No timing assertion: step and host time belong to the benchmark; but a
steady step of a mode whose collectives run on symmpool must make no host
round trip to the peers (memory_stats()["heap_exchanges"]): each would
make every rank's host wait for the slowest one's.
FSDP2_REGRESSION_CONFIG picks another config (default mid-b2s1024).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from launch import gpu_count

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = os.environ.get("FSDP2_REGRESSION_CONFIG", "mid-b2s1024")
PEAK_BOUND = {"symm": 0.02, "symm-always": 0.02, "symm-nccl": 0.02, "symm-noflag": 0.01, "symm-hooks": 0.02}
LOSS_RTOL = 1e-5

pytestmark = pytest.mark.skipif(gpu_count() < 2, reason=f"needs 2 or more CUDA GPUs, found {gpu_count()}")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """One run of each mode; the aggregated runs by mode, and the output."""
    tmp = tmp_path_factory.mktemp("fsdp2_regression")
    out = tmp / "result.json"
    modes = ["stock", *PEAK_BOUND]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench/fsdp2/run.py"), "--configs", CONFIG, "--modes", ",".join(modes),
         "--reps", "2", "--steps", "5", "--warmup", "3", "--profile-steps", "0", "--no-plot", "--deterministic",
         "--run-timeout", "300", "--out", str(out), "--log-dir", str(tmp / "logs")],
        capture_output=True, text=True, timeout=1800)
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    assert out.exists(), f"run.py wrote no result (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    [config] = json.loads(out.read_text())["configs"]
    runs = {r["mode"]: r for r in config["runs"]}
    return runs, proc.stdout


def test_every_mode_ran(bench):
    runs, output = bench
    for mode in ["stock", *PEAK_BOUND]:
        assert runs[mode]["reps"] == 2, f"{mode} failed: {runs[mode]['failures']}\n{output}"


@pytest.mark.parametrize("mode", list(PEAK_BOUND))
def test_device_peak_stays_within_the_bound_of_stock(bench, mode):
    runs, output = bench
    stock, run = runs["stock"], runs[mode]
    if not (stock["reps"] and run["reps"]):
        pytest.fail(f"no result to compare: stock {stock['failures']}, {mode} {run['failures']}")
    limit = stock["device_peak_bytes"] * (1 + PEAK_BOUND[mode])
    gib = 2**30

    def above_baseline(r):
        return r["device_peak_above_baseline_bytes"] / gib

    assert run["device_peak_bytes"] <= limit, (
        f"{mode}: device peak {run['device_peak_bytes'] / gib:.3f} GiB > stock "
        f"{stock['device_peak_bytes'] / gib:.3f} GiB + {PEAK_BOUND[mode]:.0%} "
        f"(above the pre-model baseline: {above_baseline(run):.3f} vs {above_baseline(stock):.3f} GiB; "
        f"torch reserved {run['torch_peak_reserved_bytes'] / gib:.3f} vs "
        f"{stock['torch_peak_reserved_bytes'] / gib:.3f} GiB; symmpool reserved "
        f"{(run['symmpool_peak_reserved_bytes'] or 0) / gib:.3f} GiB)\n{output}")


def test_stock_is_deterministic(bench):
    """The loss checks below rest on this: two stock runs give the same bits.
    While attention ran flash-attention's backward (it accumulates with
    atomics), stock against stock differed by 7.3e-6 in one session, and the
    NCCL-only symm-noflag by 1.3e-5 in the next."""
    runs, output = bench
    spread = runs["stock"]["max_rel_loss_diff_vs_stock"]  # stock's second run against its first
    assert spread == 0, (f"stock against itself differs by {spread:.3e} relative: a kernel is not "
                         f"deterministic\n{output}")


@pytest.mark.parametrize("mode", list(PEAK_BOUND))
def test_losses_agree_with_stock(bench, mode):
    runs, output = bench
    diff = runs[mode]["max_rel_loss_diff_vs_stock"]
    assert diff is not None, f"{mode}: nothing to compare\n{output}"
    # Seen on 2x H200 (2026-11-23, deterministic kernels): 0 in every mode.
    bound = 0.0 if gpu_count() == 2 else LOSS_RTOL
    assert diff <= bound, f"{mode}: losses differ from stock by {diff:.3e} relative (> {bound:.1e})\n{output}"


@pytest.mark.parametrize("mode", ["symm", "symm-always", "symm-hooks"])
def test_steady_steps_make_no_host_round_trips(bench, mode):
    runs, output = bench
    per_rep = runs[mode]["heap_exchanges_per_step_per_rep"]
    assert per_rep and all(x == 0 for x in per_rep), (
        f"{mode}: {per_rep} host exchanges with the peers per measured step (a verdict or call check that "
        f"missed its cache, or a sync)\n{output}")
