"""The TP ops benchmark (bench/tp_ops) without a GPU: arguments, the shapes
of each op and model over the ranks and their memory estimate, the layout
between the sharded dim and dim 0, the exact check data, each peer's call
on CPU tensors with simulated collectives, one shape's check/interleaved
timing/agreement logic with fake ranks, the cells and their ratios, the
time budget, the JSON and the PNG. Groups, symmetric memory, symmpool's ops
and the timers themselves run on the GPU machine only."""

import json
import os
import pathlib
import sys

import pytest
import torch

# FakeRanks: two ranks seen from rank 0, over bench/peers' Ranks.first_error
from test_peers_bench import FakeRanks, help_text, load_bench

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "tp_ops"
PEERS_BENCH = ROOT / "bench" / "peers"
MODULES = ("run", "plot", "shapes", "data", "layout", "tp_peers", "measure", "report")
REUSED = ("timing", "cells", "peers", "peers_run", "run_output", "figures")  # bench/peers' modules it imports

SYMMPOOL_LOADED_BEFORE = "symmpool" in sys.modules
M = load_bench([BENCH, PEERS_BENCH], MODULES, REUSED)
run, plot, shapes, data, layout = M["run"], M["plot"], M["shapes"], M["data"], M["layout"]
tp_peers, measure, report = M["tp_peers"], M["measure"], M["report"]
timing = measure.timing  # bench/peers' timing.py, as measure.py imported it
BF16 = torch.bfloat16


def test_loading_turns_multicast_off_and_needs_no_symmpool():
    for key, value in run.peers_run.MULTICAST_OFF.items():
        assert M["env"][key] == value
    assert M["env"]["SYMMPOOL_COLLECTIVES"] == "always"
    assert SYMMPOOL_LOADED_BEFORE or "symmpool" not in sys.modules
    assert report.timing is measure.timing  # bench/peers' timing.py, not a copy


def test_defaults_are_the_issue_shapes_ops_and_peers():
    args = run.parse_args([])
    assert args.ops == ["all_gather_matmul", "matmul_reduce_scatter"]
    assert args.peers == ["symmpool-fused", "nccl-unfused", "torch-fused", "matmul-alone", "transfer-alone"]
    assert args.models == ["8b", "70b"] and args.m == [2048, 8192, 32768]
    assert (args.gather_dim, args.scatter_dim, args.time_budget, args.memory_fraction) == (0, 0, None, 0.9)
    args = run.parse_args(["--models", "70b", "--tokens", "8192,2048,8192", "--gather-dim", "1", "--peers",
                           "matmul-alone,symmpool-fused", "--time-budget", "480"])
    assert args.models == ["70b"] and args.m == [2048, 8192] and args.gather_dim == 1
    assert args.peers == ["matmul-alone", "symmpool-fused"] and args.time_budget == 480


def test_bad_arguments_exit_with_a_message(capsys):
    for argv, text in ((["--models", "8b,405b"], "unknown models: 405b"), (["--tokens", "2k"], "whole numbers"),
                       (["--tokens", "0"], "positive"), (["--peers", "nccl"], "unknown peers: nccl"),
                       (["--ops", "all_reduce"], "unknown ops"), (["--gather-dim", "2"], "invalid choice"),
                       (["--reps", "0"], "must be >= 1"), (["--memory-fraction", "1.5"], "(0, 1]")):
        with pytest.raises(SystemExit) as e:
            run.parse_args(argv)
        assert e.value.code == 2
        assert text in capsys.readouterr().err


def test_help_needs_no_gpu():
    text = help_text(BENCH / "run.py")
    assert "--time-budget" in text and "--gather-dim" in text


def test_shapes_split_llama_layers_as_tensor_parallelism_does():
    ag = shapes.make_shape("all_gather_matmul", "8b", 2048, world=2)
    assert (ag.a_shard, ag.a, ag.b, ag.c, ag.stacked) == ((1024, 4096), (2048, 4096), (4096, 7168), (2048, 7168),
                                                           (2048, 4096))
    assert ag.flops == 2 * 2048 * 4096 * 7168 and ag.transfer_bytes == 2048 * 4096 * 2
    rs = shapes.make_shape("matmul_reduce_scatter", "70b", 32768, world=2)
    assert (rs.a, rs.b, rs.c, rs.out, rs.stacked) == ((32768, 14336), (14336, 8192), (32768, 8192), (16384, 8192),
                                                      (32768, 8192))
    assert rs.transfer_bytes == 32768 * 8192 * 2  # the reduce-scatter's input
    assert shapes.make_shape("matmul_reduce_scatter", "8b", 8192, world=8).a == (8192, 14336 // 8)
    described = rs.describe()
    assert described["scatter_dim"] == 0 and described["out"] == [16384, 8192] and described["world"] == 2
    assert "gather_dim" in ag.describe() and ag.describe()["a_shard"] == [1024, 4096]


def test_dim_1_shards_the_sequence_of_batch_first_activations():
    ag = shapes.make_shape("all_gather_matmul", "8b", 8192, world=2, dim=1, batch=4)
    assert (ag.a_shard, ag.a, ag.c, ag.stacked) == ((4, 1024, 4096), (4, 2048, 4096), (4, 2048, 7168),
                                                    (8, 1024, 4096))
    rs = shapes.make_shape("matmul_reduce_scatter", "70b", 2048, world=4, dim=1, batch=2)
    assert (rs.a, rs.out, rs.stacked) == ((2, 1024, 7168), (2, 256, 8192), (8, 256, 8192))
    assert rs.flops == 2 * 2048 * 7168 * 8192


def test_shapes_that_do_not_split_are_unfit():
    for kwargs, text in (({"world": 3}, "MLP width 14336 does not split over 3"),
                         ({"world": 4, "m": 2050}, "M=2050"),
                         ({"world": 2, "dim": 1, "batch": 3}, "whole number of sequences"),
                         ({"world": 16, "dim": 1, "batch": 256, "m": 2048}, "seq=8")):
        args = {"op": "all_gather_matmul", "model": "8b", "m": 2048, **kwargs}
        with pytest.raises(shapes.Unfit, match=text):
            shapes.make_shape(**args)


def test_memory_estimate_counts_inputs_reference_and_each_peer():
    ag = shapes.make_shape("all_gather_matmul", "70b", 32768, world=2)
    terms = shapes.memory_terms(ag, list(tp_peers.PEERS))
    a, c = 32768 * 8192 * 2, 32768 * 14336 * 2
    assert terms["inputs"] == a // 2 + 8192 * 14336 * 2 and terms["reference"] == 2 * a + c
    assert terms["matmul-alone"] == a + c and terms["symmpool-fused"] == 2 * (a + c)
    assert 10 << 30 < sum(terms.values()) < 20 << 30  # fits an H200 (141 GB) easily
    only = shapes.memory_terms(ag, ["matmul-alone"])
    assert set(only) == {"inputs", "reference", "matmul-alone", "nccl-unfused"}  # nccl-unfused: the reference
    relaid = shapes.memory_terms(shapes.make_shape("all_gather_matmul", "70b", 32768, 2, dim=1, batch=4),
                                 ["nccl-unfused"])
    assert relaid["nccl-unfused"] == terms["nccl-unfused"] + 2 * a  # the copy out of dim 0, two in flight
    assert shapes.fits(10 << 30, [100 << 30, 12 << 30], 0.9) is None
    assert shapes.fits(11 << 30, [100 << 30, 12 << 30], 0.9) == \
        "needs ~11.0 GiB per rank, more than 0.9 of the 12.0 GiB available"


@pytest.mark.parametrize("dim", [0, 1])
def test_layout_gathers_and_stages_along_the_sharded_dim(dim):
    world, shard = 3, ((4, 5) if dim == 0 else (2, 4, 5))
    shards = [torch.randn(shard) for _ in range(world)]
    stacked = torch.cat(shards)  # what a dim-0 all-gather gives
    assert torch.equal(layout.gathered(stacked, world, shard, dim), torch.cat(shards, dim))
    fulls = [torch.randn(torch.cat(shards, dim).shape) for _ in range(world)]  # each rank's A @ B
    staged = [layout.stage(f, world, dim) for f in fulls]
    for rank in range(world):  # a dim-0 reduce-scatter: chunk `rank` of the stacked inputs, summed
        got = sum(s.view(world, *shard)[rank] for s in staged)
        assert torch.allclose(got, sum(fulls).chunk(world, dim)[rank])
    full = fulls[0]
    if dim == 0:
        assert layout.stage(full, world, 0).data_ptr() == full.data_ptr()  # a view, no copy
    else:
        out = torch.empty(world * shard[0], *shard[1:])
        assert layout.stage(full, world, 1, out=out) is out and torch.equal(out, staged[0])


def test_check_ranges_keep_every_sum_within_256():
    assert data.check_ranges(1) == (4, 16) and data.check_ranges(2) == (4, 8) and data.check_ranges(16) == (4, 1)
    assert data.check_ranges(32) == (2, 2) and data.check_ranges(256) == (1, 1)
    for terms in (1, 2, 3, 8, 17, 64, 256):
        v, rows = data.check_ranges(terms)
        assert terms * rows * v * v <= 256 and rows >= 1
    with pytest.raises(ValueError, match="no exact bf16"):
        data.check_ranges(257)


def test_check_data_sums_are_exact_in_bf16_in_any_order():
    world, m, k, n = 8, 64, 512, 48
    gens = [data.generator("cpu", 0, r, "matmul_reduce_scatter/8b") for r in range(world)]
    a = [torch.empty(m, k, dtype=BF16) for _ in range(world)]
    b = [torch.empty(k, n, dtype=BF16) for _ in range(world)]
    for r in range(world):
        data.fill_check(a[r], b[r], world, gens[r])
    v, rows = data.check_ranges(world)
    assert a[0].abs().max() <= v and torch.equal(a[0], a[0].round()) and a[0].ne(0).float().mean() > 0.5
    assert int(b[0].ne(0).any(dim=1).sum()) <= rows and not torch.equal(a[0], a[1])
    exact = sum(x.double() @ y.double() for x, y in zip(a, b))
    assert exact.abs().max() <= 256
    # bf16 results of matmuls in K chunks (as split-K kernels do), summed over ranks in two orders
    parts = [sum((x[:, i:i + 64] @ y[i:i + 64]) for i in range(0, k, 64)) for x, y in zip(a, b)]
    assert all(p.dtype == BF16 for p in parts)
    assert torch.equal(sum(parts).double(), exact) and torch.equal(sum(reversed(parts)).double(), exact)
    again = torch.empty(m, k, dtype=BF16)
    data.fill_check(again, torch.empty(k, n, dtype=BF16), world, data.generator("cpu", 0, 0,
                                                                                  "matmul_reduce_scatter/8b"))
    assert torch.equal(again, a[0])  # the same in every run


def test_timing_data_is_normal_random():
    t = torch.empty(256, 256, dtype=BF16)
    data.fill_timing([t], data.generator("cpu", 0, 0, "x"))
    assert 0.9 < t.float().std() < 1.1 and t.unique().numel() > 1000


def test_the_group_size_goes_where_the_schema_takes_it():
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem)

    x = torch.zeros(2)
    with_size = tp_peers.with_group_size(torch.ops._c10d_functional.all_gather_into_tensor, (x,), 2, "g")
    assert with_size[1:] == (2, "g")
    without = tp_peers.with_group_size(torch.ops.symm_mem._low_contention_all_gather, (x,), 2, "g")
    assert without[1:] == ("g",)
    fused = tp_peers.with_group_size(torch.ops.symm_mem.fused_all_gather_matmul, (x, [x], 0), 2, "g")
    assert fused[3:] == ("g",)  # torch's fused op takes no group size


class FakeOp:
    """A torch.ops.symmpool op: `fn` does the work, `schema` is what
    with_group_size reads."""

    def __init__(self, schema, fn):
        self.default = type("Overload", (), {"_schema": torch._C.parse_schema(schema)})()
        self.fn, self.calls = fn, []

    def __call__(self, *args):
        self.calls.append(args)
        return self.fn(*args)


def make_inputs(shape, fill=True):
    first = shape.a_shard if shape.op == "all_gather_matmul" else shape.a
    inputs = tp_peers.Inputs(torch.empty(first, dtype=BF16), torch.empty(shape.b, dtype=BF16))
    if fill:
        data.fill_check(inputs.a, inputs.b, shape.world, data.generator("cpu", 1, 0, "test"))
    return inputs


@pytest.fixture
def two_ranks(monkeypatch):
    """Rank 0 of 2 on CPU: the other rank's all-gather shard is ours + 1, its
    reduce-scatter input equals ours."""
    def all_gather(out, inp, group=None):
        out.copy_(torch.cat([inp, inp + 1]))

    def reduce_scatter(out, inp, group=None):
        out.copy_(2 * inp.view(2, *out.shape)[0])
    monkeypatch.setattr(tp_peers.dist, "all_gather_into_tensor", all_gather)
    monkeypatch.setattr(tp_peers.dist, "reduce_scatter_tensor", reduce_scatter)
    return tp_peers.Groups(2, type("G", (), {"group_name": "nccl0"})(), symm_name="symm0")


@pytest.mark.parametrize("dim", [0, 1])
def test_nccl_unfused_and_matmul_alone_compute_the_op(two_ranks, dim):
    ag = shapes.make_shape("all_gather_matmul", "8b", 64, 2, dim=dim, batch=2)
    ag = shapes.Shape(ag.op, ag.model, ag.m, 2, dim, ag.lead, 32, 16)  # small K and N for CPU
    inputs = make_inputs(ag)
    call = tp_peers.make_call("nccl-unfused", ag, inputs, two_ranks)
    for t in call.poison:
        t.fill_(float("nan"))
    got = call.run()
    whole = torch.cat([inputs.a, inputs.a + 1], dim)
    assert torch.equal(got["a"], whole) and torch.equal(got["c"], whole @ inputs.b)
    assert got["stacked"].shape == ag.stacked and set(got) == {"stacked", "a", "c"}
    alone = tp_peers.make_call("matmul-alone", ag, inputs, two_ranks)
    assert set(alone.inputs) == {"a"} and alone.inputs["a"].shape == ag.a  # filled from the reference's A
    alone.inputs["a"].copy_(got["a"])
    assert torch.equal(alone.run()["c"], got["c"]) and alone.poison[0].data_ptr() == alone.run()["c"].data_ptr()

    rs = shapes.make_shape("matmul_reduce_scatter", "8b", 64, 2, dim=dim, batch=2)
    rs = shapes.Shape(rs.op, rs.model, rs.m, 2, dim, rs.lead, 32, 16)
    inputs = make_inputs(rs)
    got = tp_peers.make_call("nccl-unfused", rs, inputs, two_ranks).run()
    product = inputs.a @ inputs.b
    assert torch.equal(got["c"], product) and got["out"].shape == rs.out
    assert torch.equal(got["out"], 2 * product.chunk(2, dim)[0])
    assert torch.equal(tp_peers.make_call("matmul-alone", rs, inputs, two_ranks).run()["c"], product)


def test_symmpool_peers_call_its_ops_with_or_without_the_group_size(two_ranks, monkeypatch):
    ag = shapes.Shape("all_gather_matmul", "8b", 64, 2, 0, (64,), 32, 16)
    rs = shapes.Shape("matmul_reduce_scatter", "8b", 64, 2, 0, (64,), 32, 16)
    ops = type("Namespace", (), {
        "fused_all_gather_matmul": FakeOp(
            "symmpool::fused_all_gather_matmul(Tensor A_shard, Tensor[] Bs, int gather_dim, int group_size, "
            "str group_name) -> (Tensor, Tensor[])", lambda a, bs, dim, size, name: (a.repeat(2, 1), [a @ bs[0]])),
        "fused_matmul_reduce_scatter": FakeOp(
            "symmpool::fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, "
            "int group_size, str group_name) -> Tensor", lambda a, b, op, dim, size, name: (a @ b)[:32]),
        "all_gather": FakeOp("symmpool::all_gather(Tensor input, str group_name) -> Tensor",
                             lambda x, name: x.repeat(2, 1)),  # today's signature
        "reduce_scatter": FakeOp(
            "symmpool::reduce_scatter(Tensor input, str reduce_op, int group_size, str group_name) -> Tensor",
            lambda x, op, size, name: x[:32]),  # the coming one
    })()
    monkeypatch.setattr(torch.ops, "symmpool", ops, raising=False)
    inputs = make_inputs(ag)
    got = tp_peers.make_call("symmpool-fused", ag, inputs, two_ranks).run()
    assert set(got) == {"a", "c"} and ops.fused_all_gather_matmul.calls[0][2:] == (0, 2, "symm0")
    assert set(tp_peers.make_call("transfer-alone", ag, inputs, two_ranks).run()) == {"stacked"}
    assert ops.all_gather.calls[0][1:] == ("symm0",)
    inputs = make_inputs(rs)
    assert set(tp_peers.make_call("symmpool-fused", rs, inputs, two_ranks).run()) == {"out"}
    assert ops.fused_matmul_reduce_scatter.calls[0][2:] == ("sum", 0, 2, "symm0")
    transfer = tp_peers.make_call("transfer-alone", rs, inputs, two_ranks)
    assert set(transfer.inputs) == {"stacked"} and transfer.inputs["stacked"].shape == rs.stacked
    assert transfer.run()["out"].shape == rs.out and ops.reduce_scatter.calls[0][1:] == ("sum", 2, "symm0")


def test_symmpool_fused_is_unavailable_where_symmpool_ran_it_unfused(two_ranks, monkeypatch):
    """At world size 1 symmpool's fused op falls back to the unfused ops;
    the first GPU run (1x H100) timed that fallback as "symmpool-fused"."""
    counts = {}

    def fused_op(a, bs, dim, size, name):
        counts[verdict[0]] = counts.get(verdict[0], 0) + 1
        return a.repeat(2, 1), [a @ bs[0]]
    ops = type("Namespace", (), {"fused_all_gather_matmul": FakeOp(
        "symmpool::fused_all_gather_matmul(Tensor A_shard, Tensor[] Bs, int gather_dim, int group_size, "
        "str group_name) -> (Tensor, Tensor[])", fused_op)})()
    monkeypatch.setattr(torch.ops, "symmpool", ops, raising=False)
    ag = shapes.Shape("all_gather_matmul", "8b", 64, 2, 0, (64,), 32, 16)
    groups = tp_peers.Groups(2, two_ranks.nccl, "symm0", fused_counts=lambda: dict(counts))
    verdict = ["fused_all_gather_matmul.fallback: one rank"]
    call = tp_peers.make_call("symmpool-fused", ag, make_inputs(ag), groups)
    with pytest.raises(RuntimeError, match=r"symmpool ran it unfused \(one rank\)"):
        call.run()
    verdict[0] = "fused_all_gather_matmul.fused"
    call = tp_peers.make_call("symmpool-fused", ag, make_inputs(ag), groups)
    assert set(call.run()) == {"a", "c"}  # the check: fused
    verdict[0] = "fused_all_gather_matmul.fallback: one rank"
    call.run()  # timed calls are not checked again (no counting in the timed loop)


def test_a_peer_that_cannot_run_raises_at_setup(two_ranks):
    ag = shapes.Shape("all_gather_matmul", "8b", 64, 2, 0, (64,), 32, 16)
    inputs = make_inputs(ag, fill=False)
    no_symm = tp_peers.Groups(2, two_ranks.nccl, symm_name=None)
    with pytest.raises(RuntimeError, match="no symm group"):
        tp_peers.make_call("symmpool-fused", ag, inputs, no_symm)
    # Built, not run: symmpool's fused op exists (if symmpool was imported) or the op lookup raises.
    try:
        tp_peers.make_call("symmpool-fused", ag, inputs, two_ranks)
    except AttributeError:
        pass
    with pytest.raises(ValueError, match="unknown peer"):
        tp_peers.make_call("nccl", ag, inputs, two_ranks)
    torch_fused = tp_peers.make_call("torch-fused", ag, inputs, two_ranks)  # built; it runs on GPUs only
    assert torch_fused.poison == () and torch_fused.inputs == {}


def test_rotation_puts_each_peer_first_in_turn():
    names = ["a", "b", "c"]
    assert [measure.rotation(names, r) for r in range(4)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"],
                                                            ["a", "b", "c"]]
    assert measure.rotation([], 3) == []


def fake_call(behaviour="right", into=None):
    """A call whose result "c" is twice the shared input (the reference's
    is), or wrong, or never written (the poison stays), or raising."""
    x = into if into is not None else torch.arange(4.0)
    out = torch.zeros(4)

    def run_once():
        if behaviour == "raises":
            raise RuntimeError("not implemented for this shape")
        if behaviour != "silent":
            out.copy_(x * 2 + (1 if behaviour == "wrong" else 0))
        return {"c": out}
    return tp_peers.Call(run_once, poison=(out,))


@pytest.fixture
def shape_run(monkeypatch):
    """measure_shape() on CPU: the timer returns 10 us for the first peer
    timed in a round, 20 for the second...; the symmpool counter grows by 3
    per reading."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    order = []

    def time_eager(run_once, iters, reps, warmup, start, host=None):
        assert reps == 1
        order.append(run_once)
        host.append(float(len(order)))  # the host's per-call us: 1, 2, 3... in timing order
        return [10.0 * (1 + (len(order) - 1) % 3)]
    monkeypatch.setattr(timing, "time_eager", time_eager)
    args = run.parse_args(["--iters", "4", "--reps", "3", "--warmup", "2"])
    counter = iter(range(0, 1000, 3))

    def go(calls, ranks, reference=None):
        filled = []
        out = measure.measure_shape(calls, reference or fake_call(), lambda: filled.append("check"),
                                    lambda own: filled.append(("timing", len(own))), args, ranks,
                                    lambda: next(counter))
        return out, filled, order
    return go


def test_a_shape_checks_every_peer_then_times_them_interleaved(shape_run):
    calls = {"p": fake_call(), "q": fake_call("wrong"), "r": fake_call("silent"), "s": fake_call("raises"),
             "t": "RuntimeError: no such op"}
    ranks = FakeRanks(other=lambda v: {k: [x + 1 for x in xs] for k, xs in v.items()} if isinstance(v, dict) else v)
    out, filled, order = shape_run(calls, ranks)
    assert list(out) == ["p", "q", "r", "s", "t"]
    assert filled == ["check", ("timing", 0)]
    assert out["p"]["status"] == "ok" and out["p"]["correct"] is True and out["p"]["reason"] is None
    assert out["q"]["status"] == "wrong" and out["r"]["status"] == "wrong"  # timed all the same
    assert out["q"]["reason"] == "result differs from nccl-unfused's"
    assert out["s"] == {"status": "unavailable", "reason": "check: rank 0: RuntimeError: not implemented for "
                                                           "this shape"}
    assert out["t"] == {"status": "unavailable", "reason": "setup: RuntimeError: no such op"}
    runs = [calls[p].run for p in "pqr"]
    assert [runs.index(r) for r in order] == [0, 1, 2, 1, 2, 0, 2, 0, 1]  # rotated every round
    assert out["p"]["per_rank"] == [[10.0, 30.0, 20.0], [11.0, 31.0, 21.0]]  # rank 1's: one more
    assert out["p"]["host_per_rank"] == [[1.0, 6.0, 8.0], [2.0, 7.0, 9.0]]  # p timed 1st, 3rd, 2nd in its rounds
    assert out["p"]["calls_issued"] == 3 * (2 + 4) and out["p"]["counted"] == 3 * 3
    assert ranks.starts == 1 + 4  # the reference and each check start the ranks together


def test_an_op_that_writes_nothing_into_a_freed_right_answer_is_wrong(shape_run):
    """A peer's output may be the block a peer checked before it freed: its
    right answer must be gone (poisoned after that check), or an op that
    wrote nothing would pass (symmpool-fused's A, then transfer-alone's
    all-gather output in the same pool)."""
    shared_input = torch.arange(4.0)
    freed = torch.zeros(4)

    def writes_into_the_block():
        freed.copy_(shared_input * 2)
        return {"c": freed}
    calls = {"fused": tp_peers.Call(writes_into_the_block),
             "transfer": tp_peers.Call(lambda: {"c": freed})}  # gets the same block back, writes nothing
    out, _, _ = shape_run(calls, FakeRanks(), reference=fake_call(into=shared_input))
    assert out["fused"]["status"] == "ok"
    assert out["transfer"]["status"] == "wrong", out["transfer"]


def test_a_failure_on_any_rank_skips_the_peer_on_every_rank(shape_run):
    out, _, _ = shape_run({"p": fake_call(), "q": fake_call()}, FakeRanks(), reference=fake_call("raises"))
    assert {o["reason"] for o in out.values()} == {"reference (nccl-unfused): rank 0: RuntimeError: not "
                                                   "implemented for this shape"}
    # gathers: reference error, p check error, p result, q check error, q result, timing-data error, then
    # per round p's and q's timing errors
    out, _, _ = shape_run({"p": fake_call(), "q": fake_call()}, FakeRanks(fail_at={2}))
    assert out["p"]["reason"] == "check: rank 1: RuntimeError: boom" and out["q"]["status"] == "ok"
    out, _, _ = shape_run({"p": fake_call(), "q": fake_call()}, FakeRanks(fail_at={9}))  # round 2, q first
    assert out["q"] == {"status": "unavailable", "reason": "timing, repetition 2: rank 1: RuntimeError: boom",
                        "correct": True}
    assert out["p"]["status"] == "ok" and len(out["p"]["per_rank"][0]) == 3


def test_own_inputs_come_from_the_reference_and_are_refilled_for_timing(shape_run):
    own = torch.zeros(4)
    call = fake_call(into=own)
    call.inputs = {"x": own}

    def reference_run():
        return {"x": torch.arange(4.0), "c": torch.arange(4.0) * 2}
    reference = tp_peers.Call(reference_run)
    out, filled, _ = shape_run({"p": call}, FakeRanks(), reference=reference)
    assert out["p"]["correct"] is True and torch.equal(own, torch.arange(4.0))
    assert filled == ["check", ("timing", 1)]


def synthetic_cells():
    """Two shapes of each op with every peer; the fused peers about at
    matmul-alone's time (above it on the second shape, where symmpool's is
    wrong), one unavailable peer, one unfit shape."""
    cells = []
    for op in shapes.OPS:
        for m, fused in ((8192, 1.02), (32768, 1.10)):
            shape = shapes.make_shape(op, "70b", m, 2)
            key = (op, "70b", m)
            base = m / 10
            for peer, factor in (("matmul-alone", 1.0), ("transfer-alone", 0.6), ("nccl-unfused", 1.6),
                                 ("torch-fused", 1.3), ("symmpool-fused", fused)):
                us = base * factor
                cells.append(report.cell(key, shape, peer, "ok", None, [[us, us * 1.02, us * 0.98], [us] * 3],
                                         True, calls_issued=130, symm_collectives=130 if "fused" in peer or
                                         peer == "transfer-alone" else 0))
        cells[-1].update(status="wrong", correct=False)
        cells.append(report.cell((op, "8b", 2050), None, "symmpool-fused", "skipped", "M=2050 does not split"))
    cells.append(report.cell(("matmul_reduce_scatter", "8b", 2048), shapes.make_shape("matmul_reduce_scatter", "8b",
                                                                                       2048, 2),
                             "torch-fused", "unavailable", "check: rank 0: NotImplementedError"))
    report.add_ratios(cells)
    return cells


def test_cells_have_the_issue_fields_and_slowest_rank_statistics():
    c = synthetic_cells()[0]  # matmul-alone, all_gather_matmul, 70b, M=8192
    required = {"op", "model", "m", "shape", "peer", "status", "median_us", "p10_us", "p90_us",
                "ratio_to_matmul_alone", "speedup_vs_nccl_unfused", "reason", "correct", "per_rank_us"}
    assert required <= c.keys()
    us = 819.2
    assert c["median_us"] == pytest.approx(us) and c["p90_us"] == pytest.approx(us * (1 + 0.02 * 0.8))
    assert c["tflops"] == pytest.approx(2 * 8192 * 8192 * 14336 / us / 1e6) and c["busbw_gbps"] is None
    transfer = synthetic_cells()[1]
    assert transfer["tflops"] is None
    assert transfer["median_us"] == pytest.approx(us * 0.6)  # per round, the slower rank: rank 1 in the first
    assert transfer["busbw_gbps"] == pytest.approx(8192 * 8192 * 2 / (us * 0.6) / 1e3 / 2)


def test_ratios_speedups_and_the_target():
    cells = {(c["op"], c["m"], c["peer"]): c for c in synthetic_cells()}
    fused = cells[("all_gather_matmul", 8192, "symmpool-fused")]
    assert fused["ratio_to_matmul_alone"] == pytest.approx(1.02)
    assert fused["speedup_vs_nccl_unfused"] == pytest.approx(1.6 / 1.02)
    assert fused["matmul_longer_than_transfer"] is True and fused["meets_target"] is True
    assert cells[("all_gather_matmul", 32768, "symmpool-fused")]["meets_target"] is False
    assert cells[("all_gather_matmul", 8192, "torch-fused")]["meets_target"] is False
    assert "meets_target" not in cells[("all_gather_matmul", 8192, "nccl-unfused")]
    assert cells[("all_gather_matmul", 8192, "matmul-alone")]["ratio_to_matmul_alone"] == 1.0
    lonely = cells[("matmul_reduce_scatter", 2048, "torch-fused")]
    assert lonely["ratio_to_matmul_alone"] is None and lonely["meets_target"] is None
    longer_transfer = [report.cell(("all_gather_matmul", "8b", 2048), shapes.make_shape("all_gather_matmul", "8b",
                                                                                         2048, 2), p, "ok", None,
                                   [[t]], True) for p, t in (("matmul-alone", 10.0), ("transfer-alone", 20.0),
                                                             ("symmpool-fused", 25.0))]
    report.add_ratios(longer_transfer)
    assert longer_transfer[2]["matmul_longer_than_transfer"] is False and longer_transfer[2]["meets_target"] is None


def test_problems_are_wrong_results_and_transfers_that_ran_elsewhere():
    cells = synthetic_cells()
    assert report.problems(cells) == [f"{op} 70b M=32768 symmpool-fused: result differs from nccl-unfused's"
                                      for op in shapes.OPS]
    cells[1]["symm_collectives"] = 0  # the all-gather transfer went to NCCL
    assert report.problems(cells)[0] == "all_gather_matmul 70b M=8192 transfer-alone: 0 of 130 calls ran on symmpool"
    text = report.table(cells)
    assert "symmpool-fused" in text and "skipped: M=2050" in text and len(text.splitlines()) == len(cells) + 1


def test_plan_and_time_budget():
    args = run.parse_args(["--models", "8b,70b", "--tokens", "2048,8192", "--ops", "matmul_reduce_scatter,"
                                                                             "all_gather_matmul"])
    assert run.plan(args)[:3] == [("matmul_reduce_scatter", "8b", 2048), ("all_gather_matmul", "8b", 2048),
                                  ("matmul_reduce_scatter", "8b", 8192)]
    assert len(run.plan(args)) == 8
    assert run.budget_spent([10.0, 500.0], None) is None
    assert run.budget_spent([10.0, 479.0], 480) is None
    assert run.budget_spent([10.0, 481.0], 480) == "time budget (480 s) spent"
    row = report.cell(("all_gather_matmul", "8b", 2048), None, "torch-fused", "not_run", "time budget (480 s) spent")
    assert row["shape"] is None and row["median_us"] is None and row["tflops"] is None


def test_default_out_names_gpu_and_ranks():
    out = run.default_out("NVIDIA H200", 2)
    assert os.path.basename(out).startswith("tp_ops_h200x2_") and out.endswith(".json")
    assert os.path.dirname(out) == str(ROOT / "bench" / "results")


def test_json_and_plot(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    path = tmp_path / "tp_ops_h200x2_2026-11-24.json"
    doc = run.document({"gpu": "NVIDIA H200", "ranks": 2, "target_ratio": report.TARGET_RATIO}, synthetic_cells())
    run.run_output.write_json(str(path), doc)
    back = json.loads(path.read_text())
    assert set(back) == {"context", "cells"} and len(back["cells"]) == len(synthetic_cells())
    figures = []
    save = plot.save_figure

    def keep_figure(fig, *args):
        figures.append(fig)
        return save(fig, *args)
    monkeypatch.setattr(plot, "save_figure", keep_figure)
    png = plot.plot(str(path))
    assert png == str(tmp_path / "tp_ops_h200x2_2026-11-24.png") and os.path.getsize(png) > 1000
    # One colour per peer in the legend, the bars' own (empty bar() handles all came out the default blue).
    legend = figures[0].axes[0].get_legend()
    bar_colours = {tuple(p.get_facecolor()) for p in figures[0].axes[0].patches}
    peer_colours = [tuple(h.get_facecolor()) for h in legend.legend_handles if hasattr(h, "get_facecolor")]
    assert len(peer_colours) >= 4 and len(set(peer_colours)) == len(peer_colours), peer_colours
    assert set(peer_colours) <= bar_colours, (peer_colours, bar_colours)
    rows = [c for c in back["cells"] if c["op"] == "matmul_reduce_scatter"]
    shapes_seen = plot.shapes_of(rows)
    assert shapes_seen == [("70b", 8192), ("70b", 32768), ("8b", 2050), ("8b", 2048)]
    norm, spread, ms, notes = plot.bars(rows, "symmpool-fused", shapes_seen)
    assert norm[0] == pytest.approx(1.02) and norm[2] is None and notes == ["", "WRONG", "n/a", "n/a"]
    assert spread[0][0] <= norm[0] <= spread[0][1] and ms[0] == pytest.approx(0.8192 * 1.02)
    with pytest.raises(ValueError, match="no timed cell"):
        empty = tmp_path / "empty.json"
        run.run_output.write_json(str(empty), run.document({}, []))
        plot.plot(str(empty))


@pytest.mark.parametrize("dim", [0, 1])
def test_a_shape_runs_end_to_end_on_cpu(two_ranks, monkeypatch, dim):
    """run_shape() of a tiny layer over 2 simulated ranks: the real check
    data, reference, checks and cells; the timer runs the calls and returns
    5 us; torch's fused ops have no CPU kernel (they raise, as an op may on
    some shape), symmpool did not set up (or its pool failed)."""
    monkeypatch.setitem(shapes.MODELS, "tiny", shapes.Model("tiny", 64, 256))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(run, "available_bytes", lambda device, symmpool: 1 << 30)
    ran = []

    def time_eager(run_once, iters, reps, warmup, start, host=None):
        start()
        ran.extend(run_once() for _ in range(warmup + iters))
        host.append(2.0)
        return [5.0]
    monkeypatch.setattr(timing, "time_eager", time_eager)
    args = run.parse_args(["--models", "tiny", "--tokens", "64", "--iters", "2", "--reps", "2", "--warmup", "1",
                           "--gather-dim", str(dim), "--scatter-dim", str(dim), "--batch", "2"])
    failed = dict.fromkeys(("symmpool-fused", "transfer-alone"), "ImportError: no symmpool")
    env = {"ranks": FakeRanks(), "world": 2, "rank": 0, "device": torch.device("cpu"), "symmpool": None,
           "failed": failed, "groups": two_ranks, "counter": lambda: 0, "start": 0.0}
    monkeypatch.setattr(run.time, "monotonic", lambda: 1.0)
    for op in shapes.OPS:
        rows = {r["peer"]: r for r in run.run_shape((op, "tiny", 64), args, env)}
        assert list(rows) == args.peers
        for peer in ("nccl-unfused", "matmul-alone"):
            assert rows[peer]["status"] == "ok" and rows[peer]["correct"] is True, rows[peer]
            assert rows[peer]["median_us"] == 5.0 and rows[peer]["calls_issued"] == 2 * 3
            assert rows[peer]["host_us_median"] == 2.0
        assert rows["torch-fused"]["status"] == "unavailable" and "check: rank 0:" in rows["torch-fused"]["reason"]
        assert rows["symmpool-fused"]["reason"] == "setup: ImportError: no symmpool"
        assert rows["matmul-alone"]["shape"]["k" if op == "all_gather_matmul" else "n"] == 64
        assert all(r["memory_estimate_bytes"] > 0 for r in rows.values())
    assert len(ran) == 2 * 2 * 2 * 3  # ops x timed peers x rounds x calls

    class NoPool:  # symmpool imported, its pool fails: its peers sit the shape out, the others run
        @staticmethod
        def mem_pool():
            raise RuntimeError("no pluggable allocator")
    rows = {r["peer"]: r for r in run.run_shape(("all_gather_matmul", "tiny", 64), args,
                                                 {**env, "symmpool": NoPool, "failed": {}})}
    assert rows["transfer-alone"]["reason"] == \
        "setup: symmpool.mem_pool(): rank 0: RuntimeError: no pluggable allocator"
    assert rows["nccl-unfused"]["status"] == "ok"
    unfit = run.run_shape(("all_gather_matmul", "tiny", 65), args, env)
    assert {r["status"] for r in unfit} == {"skipped"} and unfit[0]["shape"] is None
    assert unfit[0]["reason"] == ("M=65 (sharded dim 0) does not split over 2 ranks" if dim == 0 else
                                  "M=65 is not a whole number of sequences of batch 2")
    monkeypatch.setattr(run, "available_bytes", lambda device, symmpool: 1000)
    assert run.run_shape(("all_gather_matmul", "tiny", 64), args, env)[0]["reason"].startswith("needs ~")
    args.time_budget = 0.5
    assert {r["status"] for r in run.run_shape(("all_gather_matmul", "tiny", 64), args, env)} == {"not_run"}
