"""The low-latency all-reduce through torch.distributed on a "symm" group
(dist_low_latency.py holds the workers)."""

import dist_low_latency
from launch import gpu_count, needs_two, one_gpu_only, run_sharing_one_gpu, run_workers


@needs_two
def test_low_latency_all_reduce_matches_gloo():
    run_workers(dist_low_latency.low_latency_all_reduce_matches_gloo, gpu_count(), timeout=300)


# Where one GPU is all there is, both ranks run on it.
@one_gpu_only
def test_low_latency_all_reduce_with_two_ranks_sharing_one_gpu():
    run_sharing_one_gpu(dist_low_latency.low_latency_all_reduce_matches_gloo, 2, timeout=300)


# The table picks low-latency at 2 ranks only: 2 ranks, on 2 GPUs or sharing one.
@needs_two
def test_plain_tensors_take_low_latency_by_the_table():
    run_workers(dist_low_latency.plain_tensors_take_low_latency_by_the_table, 2, timeout=300)


@one_gpu_only
def test_plain_tensors_take_low_latency_with_two_ranks_sharing_one_gpu():
    run_sharing_one_gpu(dist_low_latency.plain_tensors_take_low_latency_by_the_table, 2, timeout=300)
