"""symmpool's reduce-scatter and all-reduce algorithms through torch.distributed
on a "symm" group, against gloo (dist_reduction_algorithms.py holds the
workers)."""

import dist_reduction_algorithms
import pytest
from launch import gpu_count, needs_gpu, needs_two, one_gpu_only, run_sharing_one_gpu, run_workers

# (all-reduce, reduce-scatter) algorithms, as SYMMPOOL_*_ALGORITHM spell them.
PAIRS = [("two-step", "two-step"), ("two-shot", "one-shot"), ("one-shot", "one-shot")]


@needs_two
@pytest.mark.parametrize("all_reduce,reduce_scatter", PAIRS)
def test_algorithms_match_gloo(all_reduce, reduce_scatter):
    run_workers(dist_reduction_algorithms.algorithms_match_gloo, gpu_count(), all_reduce, reduce_scatter,
                timeout=300)


# Where one GPU is all there is, both ranks run on it.
@one_gpu_only
@pytest.mark.parametrize("all_reduce,reduce_scatter", PAIRS)
def test_algorithms_with_two_ranks_sharing_one_gpu(all_reduce, reduce_scatter):
    run_sharing_one_gpu(dist_reduction_algorithms.algorithms_match_gloo, 2, all_reduce, reduce_scatter,
                        timeout=300)


# 3 and 5 ranks, all on GPU 0: the reduce kernel's 4- and 8-rank variants
# (one-shot, two-shot, two-step's local sum), worlds that are not a power of
# two, on any machine with a GPU.
@needs_gpu
@pytest.mark.parametrize("world", [3, 5])
@pytest.mark.parametrize("all_reduce,reduce_scatter", [("two-shot", "one-shot"), ("one-shot", "two-step")])
def test_algorithms_with_more_ranks_sharing_one_gpu(world, all_reduce, reduce_scatter):
    run_sharing_one_gpu(dist_reduction_algorithms.algorithms_match_gloo, world, all_reduce, reduce_scatter,
                        timeout=400)
