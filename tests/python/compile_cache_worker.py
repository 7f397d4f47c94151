"""One rank of test_ops.py's compile-cache test (issue 16): compiles a step of
all_gather and reduce_scatter with inductor and checks it against eager.

    python compile_cache_worker.py RANK WORLD STORE_FILE

The test runs it on 2 ranks, then on 1, with one TORCHINDUCTOR_CACHE_DIR.
"""

import sys

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

import symmpool  # noqa: F401  (registers the ops)


def main(rank: int, world: int, store_file: str) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world, store=dist.FileStore(store_file, world))
    group = dist.group.WORLD
    size, name = group.size(), group.group_name  # the same name ("0") on any number of ranks

    # Only the ops: inductor then writes no C++ kernel (no g++ run, seconds
    # saved), and a graph compiled for another group size still fails, on the
    # size checks of the ops' outputs.
    def step(x):
        gathered = torch.ops.symmpool.all_gather(x, size, name)
        return torch.ops.symmpool.reduce_scatter(gathered, "sum", size, name)

    x = torch.arange(12.0).reshape(6, 2) + rank
    torch.testing.assert_close(torch.compile(step, fullgraph=True)(x), step(x))

    # The caches are on: compiled again, the same step comes from them.
    hits = counters["aot_autograd"]["autograd_cache_hit"]
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(step, fullgraph=True)(x), step(x))
    assert counters["aot_autograd"]["autograd_cache_hit"] == hits + 1, dict(counters["aot_autograd"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
