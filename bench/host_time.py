"""Where a call's host time goes: the host's time per call of symmpool's
eager collectives and fused tensor-parallel ops, each through every layer
a user may call it from, beside the floors it stands on (the matmuls
alone, torch's own symm_mem ops where they run).

    torchrun --standalone --nproc-per-node=2 bench/host_time.py \\
        --out bench/results/host_time_<gpu>x<N>_<date>.json

`--share-gpu` puts every rank on GPU 0 (SYMMPOOL_TEST_RANKS_SHARE_GPU=1):
on a machine with one GPU it still measures the host's side of a 2-rank
call, which does not depend on where the peer's GPU is; the GPU's times do
not stand there and are not reported. NCCL refuses such a group, so the
process group is "cpu:gloo,cuda:symm" without a bound device and every
collective runs on symmpool (SYMMPOOL_COLLECTIVES=always).

Each case runs --warmup calls; then, in each of --reps repetitions, every
case in turn (the order rotates) runs --calls calls: host time per call from
the first call to the last one's return, the device synchronized and the
ranks met (over gloo) before each.
Rank 0 prints a table and writes the JSON (median, p10, p90 over
repetitions of the slowest rank's time). `--cases REGEX` keeps the cases it
matches (short runs, alternated between two builds for an A/B);
`--only CASE --seconds S` loops one case, for a sampling profiler (py-spy)
to attach to. Refuses a tree whose tracked files differ from its commit
unless --allow-dirty (bench/provenance.py).
"""

from __future__ import annotations

import os

# NVLink multicast stays off on the lent machines, set before torch reads it.
os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
                  SYMMPOOL_DISABLE_MULTICAST="1", SYMMPOOL_COLLECTIVES="always")

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Callable  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch._C._distributed_c10d import AllgatherOptions, AllreduceOptions, ReduceScatterOptions  # noqa: E402

import provenance  # noqa: E402  (bench/, this script's folder)
import symmpool  # noqa: E402
import timing  # noqa: E402  (bench/peers)

DTYPE = torch.bfloat16
MODELS = {"8b": (4096, 14336), "70b": (8192, 28672)}  # Llama-3 (hidden, MLP width)


def share_gpu() -> bool:
    return os.environ.get("SYMMPOOL_TEST_RANKS_SHARE_GPU", "") == "1"


def meet() -> None:
    """The device synchronized, then the ranks met on the host."""
    torch.cuda.synchronize()
    dist.all_reduce(torch.zeros(1))  # gloo: the host-side meeting


def per_call_us(run: Callable[[], object], calls: int) -> float:
    """Host microseconds per call of `calls` calls, from the first call to the last one's return."""
    began = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - began) * 1e6 / calls


class Setup:
    """The group, its backend and the inputs every case reads."""

    def __init__(self, args) -> None:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        index = 0 if share_gpu() else local_rank
        torch.cuda.set_device(index)
        self.device = torch.device("cuda", index)
        # No bound device where ranks share a GPU: it would connect NCCL at once.
        dist.init_process_group("cpu:gloo,cuda:symm", **({} if share_gpu() else {"device_id": self.device}))
        self.group = dist.group.WORLD
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.name = self.group.group_name
        self.backend = self.group._get_backend(self.device)
        # A plain "nccl" group over the same ranks: symmpool on the user's
        # own mesh (FSDP2's hooks, the fused ops), its heap formed on demand.
        self.plain = dist.new_group(backend="nccl")
        self.args = args

    def symm(self, n: int) -> torch.Tensor:
        t = self.backend.allocate_tensor(n, dtype=DTYPE, device=self.device)
        return t.normal_()

    def meet(self) -> None:
        meet()


def collective_cases(s: Setup) -> dict[str, Callable[[], object]]:
    """Small eager collectives on symmpool tensors, from each layer."""
    n = s.args.bytes // 2
    ar = s.symm(n)
    ag_out = s.symm(n * s.world)
    ag_in = ag_out.narrow(0, s.rank * n, n)  # in place, as FSDP2 gathers
    rs_in, rs_out = s.symm(n * s.world), s.symm(n)
    rs_opts = ReduceScatterOptions()
    rs_opts.reduceOp = dist.ReduceOp.SUM
    cases = {
        "all_reduce dist": lambda: dist.all_reduce(ar),
        "all_reduce dist async": lambda: dist.all_reduce(ar, async_op=True),
        "all_reduce backend": lambda: s.backend.allreduce([ar], AllreduceOptions()),
        "all_gather dist": lambda: dist.all_gather_into_tensor(ag_out, ag_in),
        "all_gather backend": lambda: s.backend._allgather_base(ag_out, ag_in, AllgatherOptions()),
        "reduce_scatter dist": lambda: dist.reduce_scatter_tensor(rs_out, rs_in),
        "reduce_scatter backend": lambda: s.backend._reduce_scatter_base(rs_out, rs_in, rs_opts),
        # The floor of any eager call: one small kernel through torch's
        # dispatcher. It also shows the host's drift between runs.
        "one small kernel (add_)": lambda: ar.add_(0),
    }
    # The functional ops, their new outputs in symmpool's pool (symmetric on
    # every rank, as symmpool runs them; plain ones would go to NCCL).
    pool = symmpool.mem_pool()
    ag_src = s.symm(n)  # at the same place on every rank, unlike the in-place slice above

    def in_pool(call: Callable[[], object]) -> Callable[[], object]:
        def run():
            with torch.cuda.use_mem_pool(pool):
                return call()
        return run

    cases.update({
        "all_reduce op (in symmpool's pool)": in_pool(lambda: torch.ops.symmpool.all_reduce(ar, "sum", s.name)),
        "all_gather op (in symmpool's pool)": in_pool(
            lambda: torch.ops.symmpool.all_gather(ag_src, s.world, s.name)),
        "use_mem_pool alone": in_pool(lambda: None),
    })
    cases.update(torch_symm_mem_cases(s, n))
    return cases


def torch_symm_mem_cases(s: Setup, n: int) -> dict[str, Callable[[], object]]:
    """torch's own one-shot and two-shot all-reduce, where they set up here."""
    try:
        import torch.distributed._symmetric_memory as symm_mem
        t = symm_mem.empty(n, dtype=DTYPE, device=s.device).normal_()
        symm_mem.rendezvous(t, s.name)
        return {"all_reduce torch one_shot": lambda: torch.ops.symm_mem.one_shot_all_reduce(t, "sum", s.name),
                "all_reduce torch two_shot": lambda: torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", s.name)}
    except Exception as e:  # noqa: BLE001  (a peer that cannot set up is recorded, not fatal)
        print(f"[rank {s.rank}] torch symm_mem ops unavailable: {type(e).__name__}: {e}", file=sys.stderr)
        return {}


def mlp_operands(s: Setup) -> tuple[torch.Tensor, ...]:
    """A Llama MLP's tensor-parallel operands at --model and --tokens: the
    column-parallel layer's sequence shard and weight, the row-parallel
    layer's input and weight."""
    hidden, mlp = MODELS[s.args.model]
    m, w = s.args.tokens, s.world
    return (torch.randn(m // w, hidden, dtype=DTYPE, device=s.device),
            torch.randn(hidden, mlp // w, dtype=DTYPE, device=s.device),
            torch.randn(m, mlp // w, dtype=DTYPE, device=s.device),
            torch.randn(mlp // w, hidden, dtype=DTYPE, device=s.device))


def plain_group_cases(s: Setup) -> dict[str, Callable[[], object]]:
    """FSDP2's hooked all-gather and reduce-scatter (symmpool.fsdp) and the
    fused ops on the plain "nccl" group, beside NCCL's own calls on it where
    NCCL runs (not where the ranks share a GPU)."""
    from symmpool.fsdp import SymmAllGather, SymmReduceScatter

    n = s.args.hook_bytes // 2
    all_gather, reduce_scatter = SymmAllGather(), SymmReduceScatter()
    ag_in = all_gather.allocate((n,), dtype=DTYPE, device=s.device).normal_()
    ag_out = all_gather.allocate((n * s.world,), dtype=DTYPE, device=s.device)
    rs_in = reduce_scatter.allocate((n * s.world,), dtype=DTYPE, device=s.device).normal_()
    rs_out = reduce_scatter.allocate((n,), dtype=DTYPE, device=s.device)
    group = s.plain
    cases = {
        "all_gather hook (nccl group)": lambda: all_gather(ag_out, ag_in, group),
        "reduce_scatter hook (nccl group)": lambda: reduce_scatter(rs_out, rs_in, group, dist.ReduceOp.SUM),
    }
    if not share_gpu():  # NCCL refuses two ranks on one GPU
        cases.update({
            "all_gather dist (nccl group)": lambda: dist.all_gather_into_tensor(ag_out, ag_in, group=group),
            "reduce_scatter dist (nccl group)": lambda: dist.reduce_scatter_tensor(rs_out, rs_in, group=group),
        })
    a_shard, b_col, a_row, b_row = mlp_operands(s)
    name, w = group.group_name, s.world
    cases.update({
        "fused_all_gather_matmul op (nccl group)": lambda: torch.ops.symmpool.fused_all_gather_matmul(
            a_shard, [b_col], 0, w, name),
        "fused_matmul_reduce_scatter op (nccl group)": lambda: torch.ops.symmpool.fused_matmul_reduce_scatter(
            a_row, b_row, "sum", 0, w, name),
    })
    return cases


def fused_cases(s: Setup) -> dict[str, Callable[[], object]]:
    """The fused TP ops at one Llama shape (column- and row-parallel MLP
    layers), from the op down to its C++ pipeline, and the matmuls alone."""
    hidden, mlp = MODELS[s.args.model]
    m, w = s.args.tokens, s.world
    a_shard, b_col, a_row, b_row = mlp_operands(s)
    a_full = torch.randn(m, hidden, dtype=DTYPE, device=s.device)
    c_full = torch.empty(m, mlp // w, dtype=DTYPE, device=s.device)
    c_row = torch.empty(m, hidden, dtype=DTYPE, device=s.device)
    ag_op, rs_op = torch.ops.symmpool.fused_all_gather_matmul, torch.ops.symmpool.fused_matmul_reduce_scatter
    shard_rows = c_full.narrow(0, 0, m // w)
    cases = {
        "fused_all_gather_matmul op": lambda: ag_op(a_shard, [b_col], 0, w, s.name),
        "matmul whole A (column-parallel)": lambda: torch.mm(a_full, b_col, out=c_full),
        "matmul one shard (column-parallel)": lambda: torch.mm(a_shard, b_col, out=shard_rows),
        "fused_matmul_reduce_scatter op": lambda: rs_op(a_row, b_row, "sum", 0, w, s.name),
        "matmul whole A (row-parallel)": lambda: torch.mm(a_row, b_row, out=c_row),
    }
    if hasattr(symmpool._C, "_fused_workspace"):  # the pipelines alone, on the op's own workspace
        symmpool._C._reserve_workspace(s.name, s.device.index, m * max(hidden, mlp // w) * 2)
        ws = symmpool._C._fused_workspace(s.name, s.device.index)
        cases.update({
            "fused_all_gather_matmul pipeline": lambda: symmpool._C._all_gather_matmul(
                s.name, a_shard, [b_col], 0, ws),
            "fused_matmul_reduce_scatter pipeline": lambda: symmpool._C._produce_and_all_to_all(
                s.name, a_row, b_row, 0, ws, "sum"),
        })
    return cases


def sample_rotating(samplers: dict[str, Callable[[], float]], reps: int,
                    meet: Callable[[], None]) -> dict[str, list[float]]:
    """Each sampler's value (host microseconds per call) in each repetition.
    Every repetition samples every case, in an order that rotates, so that
    the host's drift (these machines are shared) spreads over all of them;
    the ranks meet before each sample."""
    names, samples = list(samplers), {name: [] for name in samplers}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            meet()
            samples[name].append(samplers[name]())
    meet()
    return samples


def time_cases(cases: dict[str, Callable[[], object]], s: Setup) -> dict[str, list[float]]:
    """Host microseconds per call of each case in each repetition: --calls
    calls, from the first call to the last one's return."""
    for run in cases.values():
        for _ in range(s.args.warmup):
            run()
    return sample_rotating({name: (lambda run=run: per_call_us(run, s.args.calls)) for name, run in cases.items()},
                           s.args.reps, meet)


def report(per_case: dict[str, list[float]], context: dict, out: str | None, tree: dict | None = None) -> None:
    """Collective: rank 0 prints each case's median, p10 and p90 over
    repetitions of the slowest rank's time and writes them, with `context`
    and the run's provenance (`tree`: provenance.require_clean_tree's), to
    `out`."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, per_case)
    if dist.get_rank() != 0:
        return
    rows = []
    for name in per_case:
        stats = timing.summarize([rank[name] for rank in gathered])
        rows.append({"case": name, "host_us_median": stats["time_us_median"], "host_us_p10": stats["time_us_p10"],
                     "host_us_p90": stats["time_us_p90"]})
    width = max(len(r["case"]) for r in rows)
    print(f"{'case':<{width}} {'host us/call':>12} {'p10':>8} {'p90':>8}")
    for r in rows:
        print(f"{r['case']:<{width}} {r['host_us_median']:>12.1f} {r['host_us_p10']:>8.1f} {r['host_us_p90']:>8.1f}")
    if out:
        context = {**context, **provenance.collect(state=tree), "ranks": dist.get_world_size(),
                   "ranks_share_gpu": share_gpu()}
        with open(out, "w") as f:
            json.dump({"context": context, "results": rows}, f, indent=1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=int, default=1024, help="bytes per rank of the small collectives")
    p.add_argument("--hook-bytes", type=int, default=1 << 20,
                   help="bytes per rank of FSDP2's hooked all-gather and reduce-scatter")
    p.add_argument("--model", choices=sorted(MODELS), default="8b")
    p.add_argument("--tokens", type=int, default=2048, help="M = batch x seq of the fused ops")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--cases", help="time only the cases whose name matches this regular expression")
    p.add_argument("--only", help="loop this one case for --seconds (for a profiler), then stop")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--share-gpu", action="store_true", help="every rank on GPU 0 (one-GPU machines)")
    p.add_argument("--out", help="JSON written by rank 0")
    provenance.add_allow_dirty(p)
    args = p.parse_args()
    tree = provenance.require_clean_tree(args.allow_dirty)
    if args.share_gpu:
        os.environ["SYMMPOOL_TEST_RANKS_SHARE_GPU"] = "1"

    s = Setup(args)
    cases = {**collective_cases(s), **fused_cases(s), **plain_group_cases(s)}
    if args.cases:
        cases = {name: run for name, run in cases.items() if re.search(args.cases, name)}
        if not cases:
            p.error(f"no case matches {args.cases!r}")
    if args.only:
        if args.only not in cases:
            p.error(f"unknown case {args.only!r}; known: {', '.join(cases)}")
        run, deadline = cases[args.only], time.monotonic() + args.seconds
        while time.monotonic() < deadline:  # ranks stop together: a call count every rank shares
            for _ in range(args.calls):
                run()
            torch.cuda.synchronize()
            stop = torch.tensor([float(time.monotonic() >= deadline)])
            dist.all_reduce(stop)
            if stop.item():
                break
        dist.destroy_process_group()
        return 0

    report(time_cases(cases, s), {
        "what": "host time per call (first call to last return), slowest rank per repetition",
        "collective_bytes_per_rank": args.bytes, "hook_bytes_per_rank": args.hook_bytes, "model": args.model, "tokens": args.tokens,
        "calls_per_rep": args.calls, "reps": args.reps, "warmup": args.warmup, "cases": args.cases,
    }, args.out, tree)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
