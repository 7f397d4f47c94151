"""symmpool as the process's CUDA allocator (symmpool.install()): each
check in a fresh process (process_allocator_checks.py). Needs a GPU, but
for the refusal on a machine without one."""

import os
import subprocess
import sys

import pytest
import torch

from launch import needs_gpu

CHECKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "process_allocator_checks.py")


def run_check(name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, CHECKS, name], capture_output=True, text=True, timeout=300)


@needs_gpu
@pytest.mark.parametrize("check", ["memory_api", "training_steps", "out_of_memory", "cuda_graphs", "mem_pool",
                                   "reduce_overhead",
                                   "unsupported_features_are_named", "install_after_cuda_allocation_is_refused"])
def test_process_allocator(check):
    done = run_check(check)
    assert done.returncode == 0, f"{check}:\n{done.stdout}\n{done.stderr}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without a GPU")
def test_install_without_a_gpu_is_refused():
    done = subprocess.run([sys.executable, "-c", "import symmpool; symmpool.install()"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0 and "symmpool.install(): no CUDA device" in done.stderr, done.stderr
