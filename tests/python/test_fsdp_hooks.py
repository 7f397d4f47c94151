"""symmpool.fsdp.enable: the hooks' placement and refusals on CPU (gloo);
tests/python/test_gpu.py trains with them on GPUs against stock FSDP2."""

import dist_fsdp_hooks_cpu
from launch import run_workers


def test_enable_installs_hooks_over_the_shard_group_and_refuses_what_torch_forbids():
    run_workers(dist_fsdp_hooks_cpu.enable_installs_hooks_over_the_shard_group, 2, timeout=120)
