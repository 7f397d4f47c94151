"""Body of the bench ranks test, one process per rank on CPU (gloo):
bench/peers' cells.Ranks keeps the ranks in step, and ranks that fell out
of step (one failed inside a step, its peers did not) stop at once."""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch.distributed as dist

BENCH_PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "peers")


def ranks_in_step_exchange_and_out_of_step_stop(rank: int, world: int) -> None:
    sys.path.insert(0, BENCH_PEERS)
    import cells

    dist.init_process_group("gloo", rank=rank, world_size=world)
    ranks = cells.Ranks(dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=60)))
    ranks.start_together()
    assert ranks.gather(rank * 10) == [10 * r for r in range(world)]
    skew = ranks.start_skew_us(times=5)
    assert set(skew) == {"cpu_barrier", "start_together"}, skew
    assert all(0 <= v["median"] <= v["p90"] for v in skew.values()), skew
    assert ranks.first_error(None) is None
    assert ranks.first_error("boom" if rank == 1 else None) == "rank 1: boom"
    # Rank 0's step raised before the step's barrier; the others reached it.
    start = time.monotonic()
    try:
        if rank == 0:
            ranks.first_error("RuntimeError: CUDA error: an illegal memory access was encountered")
        else:
            ranks.start_together()
    except cells.RanksOutOfStep as e:
        waited = time.monotonic() - start
        assert "rank 0: error (RuntimeError: CUDA error" in str(e) and "rank 1: start" in str(e), str(e)
        assert waited < 20, f"stopped after {waited:.1f} s"
    else:
        raise AssertionError("ranks out of step went on")
    print(f"[rank {rank}] out of step: stopped after {time.monotonic() - start:.2f} s", flush=True)
    dist.destroy_process_group()
