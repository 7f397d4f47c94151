"""The two-step reduce-scatter and all-reduce through torch.distributed on a
"symm" group (dist_two_step.py holds the workers)."""

import dist_two_step
from launch import gpu_count, needs_two, one_gpu_only, run_sharing_one_gpu, run_workers


@needs_two
def test_two_step_matches_gloo():
    run_workers(dist_two_step.two_step_matches_gloo, gpu_count(), timeout=300)


# Where one GPU is all there is, both ranks run on it.
@one_gpu_only
def test_two_step_with_two_ranks_sharing_one_gpu():
    run_sharing_one_gpu(dist_two_step.two_step_matches_gloo, 2, timeout=300)
