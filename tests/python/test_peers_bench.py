"""The peer benchmark (bench/peers) without a GPU: arguments and sizes, the
bandwidth and percentile arithmetic, the plan of series, buffer views, one
cell's check/timing/agreement logic on CPU tensors with fake ranks, the
JSON rows and the PNG. Everything that needs CUDA or several processes
(groups, symmetric memory, the timers themselves) runs on the GPU machine
only."""

import importlib
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "peers"
MODULES = ("timing", "peers", "cells", "figures", "run_output", "plot", "run")


def load_bench(dirs: list[pathlib.Path], modules: tuple, also_imported: tuple = ()) -> dict:
    """A bench's modules, imported as its scripts import each other (by bare
    name, from `dirs`), then taken out of sys.modules and sys.path again,
    with `also_imported` (what they import from another bench's directory):
    bench/peers, bench/tp_ops and bench/fsdp2 each have a run.py and a
    plot.py that their tests import by name. run.py sets multicast and
    SYMMPOOL_COLLECTIVES variables on import: the environment is put back
    too; "env" holds it as the imports left it."""
    saved_path, saved_env = list(sys.path), dict(os.environ)
    names = (*modules, *also_imported)
    saved = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    sys.path[:0] = [str(d) for d in dirs]
    try:
        loaded = {n: importlib.import_module(n) for n in modules}
        loaded["env"] = dict(os.environ)
        return loaded
    finally:
        sys.path[:] = saved_path
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)
        os.environ.clear()
        os.environ.update(saved_env)


M = load_bench([BENCH], MODULES)
run, timing, peers, cells, plot = M["run"], M["timing"], M["peers"], M["cells"], M["plot"]
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def test_defaults_are_the_issue_sizes_ops_and_peers():
    args = run.parse_args([])
    assert args.sizes == [KIB * 4**i for i in range(11)] and args.sizes[-1] == GIB
    assert args.ops == ["all_gather", "reduce_scatter", "all_reduce"]
    assert args.peers == ["symmpool", "nccl", "nccl-registered", "nccl-window", "torch-symm-mem", "peer-copy"]
    assert args.graph and args.graph_max_bytes == 8 * MIB and args.time_budget is None
    assert args.graph_calls == 20 and args.graph_replays == 10
    assert args.two_step_pieces == [32 * MIB] and args.two_step_from == MIB
    assert not run.parse_args(["--no-graph"]).graph
    assert run.parse_args(["--two-step-pieces", "2M, 64K"]).two_step_pieces == [2 * MIB, 64 * KIB]
    assert run.parse_args(["--two-step-pieces", ""]).two_step_pieces == []


def test_symmpool_variants_name_the_algorithm_and_piece_their_group_is_made_with():
    variants = peers.symmpool_variants([8 * MIB, 96 * KIB])
    assert [(v, op) for v, op, _ in variants] == [("two-step 8M", "reduce_scatter"), ("two-step 8M", "all_reduce"),
                                                  ("two-step 98304B", "reduce_scatter"),
                                                  ("two-step 98304B", "all_reduce")]
    assert variants[0][2] == {"SYMMPOOL_TWO_STEP_PIECE_BYTES": str(8 * MIB),
                              "SYMMPOOL_REDUCE_SCATTER_ALGORITHM": "two-step"}
    assert variants[1][2] == {"SYMMPOOL_TWO_STEP_PIECE_BYTES": str(8 * MIB),
                              "SYMMPOOL_ALL_REDUCE_ALGORITHM": "two-step"}
    groups = {(v, op): f"group {v} {op}" for v, op, _ in variants}
    p = peers.C10dPeer("symmpool", "table group", None, 2, groups)
    assert p.variants("all_gather") == [None]
    assert p.variants("all_reduce") == [None, "two-step 8M", "two-step 98304B"]
    assert peers.C10dPeer("nccl", "g", None, 2).variants("reduce_scatter") == [None]


def test_all_reduce_algorithm_variants_are_groups_made_with_that_algorithm():
    variants = peers.symmpool_variants([], ["low-latency", "one-shot"])
    assert variants == [("low-latency", "all_reduce", {"SYMMPOOL_ALL_REDUCE_ALGORITHM": "low-latency"}),
                        ("one-shot", "all_reduce", {"SYMMPOOL_ALL_REDUCE_ALGORITHM": "one-shot"})]
    args = run.parse_args(["--all-reduce-algorithms", "low-latency, one-shot", "--algorithms-up-to", "256K"])
    assert args.all_reduce_algorithms == ["low-latency", "one-shot"] and args.algorithms_up_to == 256 * KIB
    assert run.parse_args([]).all_reduce_algorithms == []
    assert not run.skipped("symmpool", "low-latency", 256 * KIB, args)
    assert run.skipped("symmpool", "low-latency", 1 * MIB, args)
    with pytest.raises(SystemExit):
        run.parse_args(["--all-reduce-algorithms", "ring"])
    # A variant that fell back to the table's algorithm is a problem, not a result.
    def row(ran):
        return run.result_row("symmpool", "low-latency", "all_reduce", 256 * KIB, "graph", 2, [[1.0]],
                              correct=True, calls_issued=23, symm_collectives=23, algorithms_ran=ran)
    assert run.problems([row({"low-latency": 23})]) == []
    assert run.problems([row({"two-shot": 23})]) == [
        "symmpool low-latency all_reduce 262144 B graph: ran {'two-shot': 23}, expected 23 x low-latency"]


def test_in_place_all_gather_reads_its_input_from_its_own_slice_of_the_output():
    world, rank, nbytes = 4, 2, 4 * KIB
    bufs = peers.Buffers.make(lambda n: torch.zeros(n, dtype=peers.DTYPE), nbytes)
    p = peers.C10dPeer("symmpool", "group", bufs, world, rank=rank)
    assert p.variants("all_gather") == [None, peers.ALL_GATHER_IN_PLACE]
    assert p.variants("all_reduce") == [None]
    assert peers.C10dPeer("nccl", "g", bufs, world).variants("all_gather") == [None]  # no rank, no in-place
    call = p.call("all_gather", peers.ALL_GATHER_IN_PLACE, nbytes)
    chunk = nbytes // 2 // world
    assert call.poison.data_ptr() == bufs.b.data_ptr() and call.poison.numel() == world * chunk
    assert call.inp.data_ptr() == bufs.b[rank * chunk:].data_ptr() and call.inp.numel() == chunk
    with pytest.raises(ValueError, match="all-gather variant"):
        p.call("reduce_scatter", peers.ALL_GATHER_IN_PLACE, nbytes)


def test_symmpool_functional_op_is_an_all_reduce_variant_on_the_same_group_and_input():
    bufs = peers.Buffers.make(lambda n: torch.zeros(n, dtype=peers.DTYPE), 4 * KIB)
    group = type("G", (), {"group_name": "7"})()
    p = peers.C10dPeer("symmpool", group, bufs, 2, {("two-step 8M", "all_reduce"): "g2"}, rank=0, functional_op=True)
    assert p.variants("all_reduce") == [None, peers.SYMMPOOL_OP, peers.SYMMPOOL_OP_IN_PLACE, "two-step 8M"]
    for op in (peers.SYMMPOOL_OP, peers.SYMMPOOL_OP_IN_PLACE):
        assert op not in p.variants("all_gather") + p.variants("reduce_scatter")
        assert op not in peers.C10dPeer("nccl", group, bufs, 2, rank=0).variants("all_reduce")
        call = p.call("all_reduce", op, 4 * KIB)
        assert call.poison is None and call.inp.data_ptr() == bufs.a.data_ptr() and call.inp.numel() == 2 * KIB
        with pytest.raises(ValueError, match="all-reduce variant"):
            p.call("all_gather", op, 4 * KIB)


def test_skipped_cells_are_symmpool_pipelines_below_their_floor_and_the_op_above_low_latency():
    args = run.parse_args([])
    assert args.two_step_from == MIB
    assert run.skipped("symmpool", "two-step 32M", MIB // 2, args)
    assert not run.skipped("symmpool", "two-step 32M", MIB, args)
    assert not run.skipped("symmpool", peers.SYMMPOOL_OP, peers.SYMMPOOL_OP_MAX_BYTES, args)
    assert run.skipped("symmpool", peers.SYMMPOOL_OP, 4 * peers.SYMMPOOL_OP_MAX_BYTES, args)
    assert not run.skipped("symmpool", peers.SYMMPOOL_OP_IN_PLACE, 1 << 30, args)  # symmetric buffers: any size
    assert not run.skipped("symmpool", peers.ALL_GATHER_IN_PLACE, KIB, args)
    assert not run.skipped("symmpool", None, KIB, args)
    assert not run.skipped("nccl", peers.ALL_GATHER_IN_PLACE, KIB, args)


def test_check_poisons_before_it_writes_the_input(monkeypatch):
    """An in-place all-gather's input lies in its output: poisoning after
    writing the input would gather NaN."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # no GPU here
    out = torch.zeros(8, dtype=peers.DTYPE)
    inp = out[2:4]
    data = torch.tensor([3.0, 4.0], dtype=peers.DTYPE)

    class Ranks:
        def start_together(self):
            pass

    call = peers.Call(inp, lambda: out, poison=out, compared=lambda t: t[2:4])
    expected = torch.zeros(8, dtype=peers.DTYPE)
    expected[2:4] = data
    assert cells.check(call, data, expected, Ranks())
    assert torch.equal(out[2:4], data) and out[:2].isnan().all() and out[4:].isnan().all()


def test_sizes_parse_as_ranges_and_lists():
    assert run.parse_sizes("1K:1M:2") == [KIB << i for i in range(11)]
    assert run.parse_sizes("4KiB:64k") == [4 * KIB, 16 * KIB, 64 * KIB]
    assert run.parse_sizes("1G, 4096,1M,1M") == [4096, MIB, GIB]
    assert run.parse_sizes("256:256") == [256]
    assert run.parse_size("16MiB") == 16 * MIB and run.parse_size("1g") == GIB
    for bad in ("100", "1K:1M:1", "1M:1K", "1X", "1K:2K:3:4", ""):
        with pytest.raises(ValueError):
            run.parse_sizes(bad)


def test_bad_arguments_exit_with_a_message(capsys):
    for argv, text in ((["--sizes", "1000"], "multiples of 256"), (["--ops", "all_gather,gather"], "unknown ops"),
                       (["--peers", "nccl,mpi"], "unknown peers: mpi"), (["--iters", "0"], "must be >= 1"),
                       (["--graph-replays", "0"], "must be >= 1"), (["--graph-max-bytes", "lots"], "not a size")):
        with pytest.raises(SystemExit) as e:
            run.parse_args(argv)
        assert e.value.code == 2
        assert text in capsys.readouterr().err
    args = run.parse_args(["--ops", "all_reduce, all_gather,all_reduce", "--peers", "nccl", "--time-budget", "60"])
    assert args.ops == ["all_reduce", "all_gather"] and args.peers == ["nccl"] and args.time_budget == 60


def help_text(script: pathlib.Path) -> str:
    """`python script --help`'s output, which must come without a GPU."""
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def assert_options_reach_the_script_under_torchrun(script: pathlib.Path) -> None:
    """Each option in `script --help` passes torchrun's own parser untouched.
    That parser also reads abbreviations of its options anywhere on the
    command line, so an option that is a prefix of some of them ("--m")
    stops the launch, and one that abbreviates a single one is taken."""
    from torch.distributed.run import get_args_parser

    options = sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", help_text(script))) - {"--help"})
    assert len(options) >= 5, options
    for option in options:
        argv = ["--standalone", "--nproc-per-node=2", str(script), option, "1"]
        try:
            args = get_args_parser().parse_args(argv)
        except SystemExit:
            raise AssertionError(f"torchrun refused {script.name}'s {option}") from None
        assert args.training_script_args == [option, "1"], (option, args.training_script_args)


def test_help_needs_no_gpu():
    text = help_text(BENCH / "run.py")
    assert "--time-budget" in text and "--no-graph" in text


def test_ranks_out_of_step_stop_at_once():
    """Real gloo ranks on CPU: one rank's error verdict meeting the others'
    barrier (an exception before a step's barrier on one rank only) stops
    every rank with the reason; before, they sat in different collectives
    until the group's 300 s timeout, then crashed."""
    import dist_bench_ranks
    from launch import run_workers

    run_workers(dist_bench_ranks.ranks_in_step_exchange_and_out_of_step_stop, 2, timeout=120)


# Every script the README or gpu_check.sh starts under torchrun.
@pytest.mark.parametrize("script", ["bench/peers/run.py", "bench/tp_ops/run.py", "bench/collectives_host_cost.py",
                                    "bench/host_time.py", "examples/fsdp2_train.py"])
def test_every_option_reaches_the_script_under_torchrun(script):
    # bench/tp_ops' --m (now --tokens) stopped every launch with "ambiguous option".
    assert_options_reach_the_script_under_torchrun(ROOT / script)


def test_bandwidth_is_nccl_tests_busbw():
    algbw, busbw = timing.bandwidth("all_gather", MIB, 10.0, world=2)
    assert algbw == pytest.approx(104.8576) and busbw == pytest.approx(52.4288)
    algbw, busbw = timing.bandwidth("all_reduce", GIB, 5000.0, world=2)
    assert algbw == pytest.approx(214.7483648) and busbw == pytest.approx(214.7483648)
    assert timing.bandwidth("all_reduce", GIB, 5000.0, world=4)[1] == pytest.approx(214.7483648 * 1.5)
    assert timing.bandwidth("reduce_scatter", 8 * MIB, 100.0, world=8)[1] == pytest.approx(83.88608 * 7 / 8)
    assert timing.bandwidth("peer_copy", 2 * MIB, 10.0, world=2)[1] == pytest.approx(104.8576)
    assert timing.bandwidth("all_gather", MIB, None, world=2) == (None, None)


def test_percentiles_interpolate_like_numpy_and_the_slowest_rank_counts():
    values = [float(v) for v in range(10, 0, -1)]
    assert timing.percentile(values, 10) == pytest.approx(1.9)
    assert timing.percentile(values, 50) == pytest.approx(5.5)
    assert timing.percentile(values, 90) == pytest.approx(9.1)
    assert timing.percentile([7.0], 90) == 7.0
    assert timing.slowest_rank([[1, 5, 3], [2, 4, 3]]) == [2, 5, 3]
    assert timing.summarize([[1, 5, 3], [2, 4, 3]]) == pytest.approx(
        {"time_us_median": 3, "time_us_p10": 2.2, "time_us_p90": 4.6})
    with pytest.raises(ValueError, match="different numbers"):
        timing.slowest_rank([[1, 2], [1]])


def test_buffer_views_give_each_op_its_shapes():
    bufs = peers.Buffers.make(lambda n: torch.zeros(n, dtype=peers.DTYPE), 64 * KIB)
    assert bufs.a.numel() == bufs.b.numel() == 32 * KIB
    inp, out = bufs.views("all_gather", 16 * KIB, world=4, in_place=False)
    assert (inp.numel(), out.numel()) == (2 * KIB, 8 * KIB)
    inp, out = bufs.views("reduce_scatter", 16 * KIB, world=4, in_place=False)
    assert (inp.numel(), out.numel()) == (8 * KIB, 2 * KIB)
    inp, out = bufs.views("all_reduce", 16 * KIB, world=4, in_place=True)
    assert inp is out and inp.numel() == 8 * KIB
    inp, out = bufs.views("peer_copy", 16 * KIB, world=2, in_place=False)
    assert (inp.numel(), out.numel()) == (4 * KIB, 8 * KIB)
    assert inp.data_ptr() == bufs.a.data_ptr() and out.data_ptr() == bufs.b.data_ptr()  # offset 0: symmetric


def test_torch_symm_mem_variants_are_real_ops_never_multimem():
    p = peers.TorchSymmMemPeer(type("G", (), {"group_name": "0"})(), None, 2)
    every = [v for op in peers.OPS for v in p.variants(op)]
    assert every and not any("multimem" in v for v in every)
    assert all(p.missing(v) is None for v in every), [p.missing(v) for v in every]
    assert "not in this torch" in p.missing("no_such_op")
    bufs = peers.Buffers.make(lambda n: torch.zeros(n, dtype=peers.DTYPE), 4 * KIB)
    p.buffers = bufs
    two_shot = p.call("all_reduce", "two_shot_all_reduce_", 4 * KIB)
    one_shot = p.call("all_reduce", "one_shot_all_reduce_out", 4 * KIB)
    assert two_shot.poison is None and one_shot.poison.data_ptr() == bufs.b.data_ptr()
    assert p.call("all_gather", "_low_contention_all_gather", 4 * KIB).poison is None  # the op allocates it
    with pytest.raises(ValueError, match="unknown torch-symm-mem variant"):
        p.call("all_reduce", "_low_contention_all_gather_", 4 * KIB)


def test_peer_copy_pulls_every_other_rank_chunk_and_checks_only_those():
    world, rank, nbytes = 4, 1, 4 * KIB
    bufs = peers.Buffers.make(lambda n: torch.zeros(n, dtype=peers.DTYPE), nbytes)
    chunk = nbytes // 2 // world
    remote = {p: torch.full((chunk,), float(p + 10), dtype=peers.DTYPE) for p in range(world)}

    class Handle:
        def get_buffer(self, peer, sizes, dtype, offset):
            assert offset == 0 and tuple(sizes) == (chunk,) and dtype == peers.DTYPE
            return remote[peer]

    call = peers.PeerCopyPeer(Handle(), bufs, rank, world).call("peer_copy", None, nbytes)
    call.poison.fill_(float("nan"))
    out = call.run()
    assert out[:chunk].eq(10).all() and out[2 * chunk:].gt(11).all() and out[chunk:2 * chunk].isnan().all()
    assert call.compared(out).numel() == 3 * chunk and not call.compared(out).isnan().any()


@pytest.mark.parametrize("variant", [peers.PEER_COPY_SM, peers.PEER_COPY_BOTH])
def test_peer_copy_variants_pull_the_same_bytes_exactly(variant):
    world, rank, nbytes = 3, 2, 4 * KIB + 90  # a chunk of 697 elements: the halves differ by one
    bufs = peers.Buffers.make(lambda n: torch.zeros(n, dtype=peers.DTYPE), nbytes)
    chunk = nbytes // 2 // world
    gen = torch.Generator().manual_seed(7)
    remote = {p: torch.randn(chunk, generator=gen).to(peers.DTYPE) for p in range(world)}
    remote[0][:3] = torch.tensor([-0.0, float("inf"), float("nan")])  # copied as they are, sign and NaN too

    class Handle:
        def get_buffer(self, peer, sizes, dtype, offset):
            return remote[peer]

    peer = peers.PeerCopyPeer(Handle(), bufs, rank, world)
    assert peer.variants("peer_copy") == [None, peers.PEER_COPY_SM, peers.PEER_COPY_BOTH]
    call = peer.call("peer_copy", variant, nbytes)
    call.poison.fill_(float("nan"))
    out = call.run()
    for p in (0, 1):
        got, want = out[p * chunk:(p + 1) * chunk], remote[p]
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"peer {p}'s chunk differs"
    assert out[rank * chunk:].isnan().all()  # this rank's own chunk is not pulled
    with pytest.raises(ValueError, match="unknown peer-copy variant"):
        peer.call("peer_copy", "nvls", nbytes)


class FakeNccl:
    """torch.distributed, torch.cuda's pools and torch.empty as make_peers
    sees them, on CPU: each step lands in `log`, each tensor remembers the
    pool it was allocated in."""

    def __init__(self, monkeypatch, refuse_window=False):
        self.log, self.groups, self.pool_of, self.active = [], [], {}, []
        self.refuse_window = refuse_window
        real_empty = torch.empty

        def empty(*args, **kwargs):
            t = real_empty(*args, **kwargs)
            self.pool_of[t.data_ptr()] = self.active[-1] if self.active else None
            self.log.append(("alloc", self.active[-1] if self.active else None))
            return t

        class UseMemPool:
            def __init__(ctx, pool, device=None):
                ctx.pool = pool

            def __enter__(ctx):
                self.active.append(ctx.pool)

            def __exit__(ctx, *exc):
                self.active.pop()

        monkeypatch.setattr(torch, "empty", empty)
        monkeypatch.setattr(torch.cuda, "use_mem_pool", UseMemPool)
        monkeypatch.setattr(torch.cuda, "MemPool", lambda allocator: f"MemPool({allocator})")
        monkeypatch.setitem(sys.modules, "symmpool", type(sys)("symmpool"))
        sys.modules["symmpool"].mem_pool = lambda: "symmpool.mem_pool()"
        monkeypatch.setattr(peers.dist, "new_group", self.new_group)
        monkeypatch.setattr(peers.dist, "all_reduce", self.all_reduce)

    def new_group(self, backend):
        assert backend == "nccl"  # every NCCL peer on a plain nccl group
        fake = self

        class Backend:
            def register_mem_pool(self, pool, symm=False):
                assert group.connected, "registered before the communicator exists"
                if symm and fake.refuse_window:
                    raise RuntimeError("NCCL version does not support window registration")
                fake.log.append(("register", group.index, pool, symm))

            def deregister_mem_pool(self, pool):
                fake.log.append(("deregister", group.index, pool))

        class Group:
            index, connected, backend = len(self.groups), False, Backend()

            def _get_backend(self, device):
                return self.backend
        group = Group()
        self.groups.append(group)
        self.log.append(("new_group", group.index))
        return group

    def all_reduce(self, tensor, group):
        group.connected = True
        self.log.append(("all_reduce", group.index))


def test_nccl_peers_run_on_plain_nccl_groups_with_their_pools_registered_once(monkeypatch):
    fake = FakeNccl(monkeypatch)
    names = ["nccl", "nccl-registered", "nccl-window"]
    made, failed = peers.make_peers(names, "symm", torch.device("cpu"), 2, 0, 4 * KIB)
    assert failed == {} and list(made) == names
    assert fake.log == [("new_group", 0), ("alloc", None), ("alloc", None),  # nccl: plain buffers
                        ("new_group", 1), ("all_reduce", 1), ("alloc", "symmpool.mem_pool()"),
                        ("alloc", "symmpool.mem_pool()"), ("register", 1, "symmpool.mem_pool()", False),
                        ("new_group", 2), ("all_reduce", 2), ("alloc", "symmpool.mem_pool()"),
                        ("alloc", "symmpool.mem_pool()"), ("register", 2, "symmpool.mem_pool()", True)]
    for name, group, pool in (("nccl-registered", 1, "symmpool.mem_pool()"),
                              ("nccl-window", 2, "symmpool.mem_pool()")):
        p = made[name]
        assert p.group is fake.groups[group] and p.registration == (fake.groups[group].backend, pool)
        assert fake.pool_of[p.buffers.a.data_ptr()] == fake.pool_of[p.buffers.b.data_ptr()] == pool
        assert p.variants("all_gather") == [None, peers.ALL_GATHER_IN_PLACE]
    assert made["nccl"].registration is None
    del fake.log[:]
    peers.deregister(made, {})
    assert fake.log == [("deregister", 1, "symmpool.mem_pool()"), ("deregister", 2, "symmpool.mem_pool()")]


def test_a_nccl_peer_whose_setup_fails_is_recorded_and_planned_as_unavailable(monkeypatch):
    fake = FakeNccl(monkeypatch, refuse_window=True)
    names = ["nccl", "nccl-window", "nccl-registered"]
    made, failed = peers.make_peers(names, "symm", torch.device("cpu"), 2, 1, 4 * KIB)
    reason = "NCCL version does not support window registration"
    assert failed == {"nccl-window": f"setup: RuntimeError: {reason}"}
    assert list(made) == ["nccl", "nccl-registered"]  # the next peer is still made
    assert run.plan(["all_reduce"], made, failed, names) == [("all_reduce", "nccl", None),
                                                            ("all_reduce", "nccl-window", None),
                                                            ("all_reduce", "nccl-registered", None)]
    del fake.log[:]
    peers.deregister(made, {"nccl-registered": "setup: on rank 0"})  # failed elsewhere: left alone
    assert fake.log == []


def test_the_context_says_how_each_nccl_peer_made_and_registered_its_buffers(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H200")
    ctx = run.context_of(run.parse_args(["--peers", "nccl,nccl-window"]), 2, torch.device("cuda", 0))
    assert set(ctx["nccl_peers"]) == {"nccl", "nccl-window"}
    assert "register_mem_pool(pool, symm=True)" in ctx["nccl_peers"]["nccl-window"]
    assert "symmpool.mem_pool()" in ctx["nccl_peers"]["nccl-window"]
    assert "symm=False" in peers.NCCL_PEERS["nccl-registered"] and "symmpool.mem_pool()" in \
        peers.NCCL_PEERS["nccl-registered"]
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", ctx["nccl_runtime"]) and ctx["nccl"]
    assert set(peers.NCCL_PEERS) == {p for p in peers.PEERS if p.startswith("nccl")}


def test_plan_orders_ops_then_peers_and_keeps_failed_peers_as_one_entry():
    class Peer:
        def __init__(self, variants):
            self.v = variants

        def variants(self, op):
            return self.v.get(op, [])

    ps = {"nccl": Peer({op: [None] for op in peers.OPS}),
          "torch-symm-mem": Peer({"all_reduce": ["one_shot_all_reduce_out", "two_shot_all_reduce_"]}),
          "peer-copy": Peer({"peer_copy": [None]})}
    plan = run.plan(["all_reduce"], ps, {}, ["torch-symm-mem", "nccl", "peer-copy"])
    assert plan == [("all_reduce", "torch-symm-mem", "one_shot_all_reduce_out"),
                    ("all_reduce", "torch-symm-mem", "two_shot_all_reduce_"), ("all_reduce", "nccl", None),
                    ("peer_copy", "peer-copy", None)]
    failed = {"torch-symm-mem": "setup: boom", "peer-copy": "setup: boom"}
    plan = run.plan(["all_gather", "all_reduce"], ps, failed, ["torch-symm-mem", "peer-copy"])
    assert plan == [("all_gather", "torch-symm-mem", None), ("all_reduce", "torch-symm-mem", None),
                    ("peer_copy", "peer-copy", None)]


class FakeRanks:
    """Two ranks seen from rank 0: rank 1 says what `other` makes of rank 0's
    value, and fails (an error string) at the gathers numbered in `fail_at`."""
    world = 2
    first_error = cells.Ranks.first_error

    def __init__(self, other=lambda v: v, fail_at=()):
        self.other, self.fail_at, self.gathers, self.starts = other, set(fail_at), 0, 0

    def start_together(self):
        self.starts += 1

    def meet_on_device(self):
        return False

    def gather(self, value):
        self.gathers += 1
        return [value, "RuntimeError: boom" if self.gathers in self.fail_at else self.other(value)]

    gather_errors = gather  # numbered with the other gathers


class FakePeer:
    """A 2-rank all-reduce of equal inputs (the sum is twice the input), or a
    wrong one, or one that writes nothing."""
    name = "fake"

    def __init__(self, behaviour="right"):
        self.behaviour = behaviour

    def call(self, op, variant, nbytes):
        if self.behaviour == "raises":
            raise RuntimeError("no such size")
        inp, out = torch.zeros(4), torch.zeros(4)

        def run_once():
            if self.behaviour != "silent":
                out.copy_(inp * 2 + (1 if self.behaviour == "wrong" else 0))
            return out
        return peers.Call(inp, run_once, poison=out)


class FakeReference:
    def get(self, op, nbytes):
        data = torch.arange(4.0)
        return data, torch.cat([data * 2, torch.full((4,), -1.0)])  # longer than the result, as the real one


@pytest.fixture
def cell(monkeypatch):
    """measure() of FakePeer on CPU: the timers return fixed samples and the
    symmpool counter grows by 7 per reading."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    def time_eager(run_once, iters, reps, warmup, start, host=None):
        host.extend([3.0, 4.0, 5.0])  # the host's per-call us
        return [10.0, 12.0, 11.0]
    monkeypatch.setattr(timing, "time_eager", time_eager)
    monkeypatch.setattr(timing, "time_graph", lambda run_once, calls, reps, start, replays, meet: [5.0, 5.0, 6.0])
    args = run.parse_args(["--iters", "4", "--reps", "3", "--warmup", "2", "--graph-calls", "8"])
    counter = iter(range(0, 1000, 7))

    algorithm_counter = iter(range(0, 1000, 3))

    def measure(peer, ranks, modes=("eager", "graph")):
        def row(mode, per_rank=None, **fields):
            return run.result_row("fake", None, "all_reduce", 32, mode, 2, per_rank, **fields)
        return cells.measure(peer, None, "all_reduce", 32, list(modes), args, ranks, FakeReference(),
                             lambda: next(counter), row,
                             algorithms=lambda: {"two-step": next(algorithm_counter), "one-shot": 5})
    return measure


def test_a_cell_checks_then_times_every_mode_and_takes_the_slower_rank(cell):
    ranks = FakeRanks(other=lambda v: [x + 1 for x in v] if isinstance(v, list) else v)
    eager, graph = cell(FakePeer(), ranks)
    assert ranks.starts == 1  # the check starts the ranks together; the (fake) timers do the rest
    assert eager["correct"] is True and eager["unavailable"] is None
    assert eager["time_us_median"] == 12 and eager["calls_issued"] == 2 + 4 * 3 and eager["symm_collectives"] == 7
    assert eager["host_us_median"] == 5  # the slower rank's (rank 1: 4, 5, 6)
    assert eager["algorithms_ran"] == {"two-step": 3}  # what grew while it was timed, not what stayed
    assert graph["mode"] == "graph" and graph["time_us_median"] == 6 and graph["calls_issued"] == 3 + 8
    assert "host_us_median" not in graph  # a replay has no host time per call
    assert graph["busbw_gbps"] == pytest.approx(32 / 6 / 1e3)


def test_a_wrong_or_silent_peer_is_timed_and_flagged(cell):
    for behaviour in ("wrong", "silent"):  # silent: the NaN poison stays
        rows = cell(FakePeer(behaviour), FakeRanks())
        assert [r["correct"] for r in rows] == [False, False] and rows[0]["time_us_median"] == 11
    rows = cell(FakePeer(), FakeRanks(other=lambda v: False if v is True else v))  # wrong on rank 1 only
    assert [r["correct"] for r in rows] == [False, False]


def test_a_failure_on_any_rank_skips_the_cell_on_every_rank(cell):
    rows = cell(FakePeer("raises"), FakeRanks())
    assert [r["unavailable"] for r in rows] == ["setup: rank 0: RuntimeError: no such size"] * 2
    assert rows[0]["time_us_median"] is None and rows[0]["correct"] is None
    rows = cell(FakePeer(), FakeRanks(fail_at={1}))  # rank 1's setup failed
    assert [r["unavailable"] for r in rows] == ["setup: rank 1: RuntimeError: boom"] * 2
    rows = cell(FakePeer(), FakeRanks(fail_at={2}))  # rank 1's check raised
    assert rows[0]["unavailable"].startswith("check: rank 1")
    # gathers: setup error, check error, check result, eager error, eager samples, graph error
    eager, graph = cell(FakePeer(), FakeRanks(fail_at={4}))
    assert eager["unavailable"] == "eager: rank 1: RuntimeError: boom" and eager["correct"] is True
    assert graph["unavailable"] is None and graph["time_us_median"] == 5


def test_the_reference_data_is_small_integers_per_rank_and_made_once(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    calls = []

    class Nccl:  # a 2-rank all-gather whose other rank sent zeros
        def call(self, op, variant, nbytes):
            calls.append((op, nbytes))
            inp = torch.empty(nbytes // 4, dtype=peers.DTYPE)
            return peers.Call(inp, lambda: torch.cat([inp, torch.zeros_like(inp)]))

    refs = [cells.Reference(Nccl(), torch.device("cpu"), rank, 2, seed=0, max_bytes=64 * KIB) for rank in (0, 1)]
    data0, expected0 = refs[0].get("all_gather", 16 * KIB)
    data1, _ = refs[1].get("all_gather", 16 * KIB)
    assert data0.numel() == 4 * KIB and data0.abs().max() <= 8 and torch.equal(data0, data0.round())
    assert not torch.equal(data0, data1)  # rank-dependent
    assert torch.equal(expected0[:4 * KIB], data0) and expected0[4 * KIB:8 * KIB].eq(0).all()
    again, _ = refs[0].get("peer_copy", 16 * KIB)  # the peer copy checks against the all-gather's
    assert torch.equal(again, data0) and calls == [("all_gather", 16 * KIB)] * 2


def synthetic_document():
    rows = []
    for nbytes in (KIB, MIB, GIB):
        for peer, variant, op in (("symmpool", None, "all_gather"), ("nccl", None, "all_gather"),
                                  ("torch-symm-mem", "one_shot_all_reduce_out", "all_reduce"),
                                  ("peer-copy", None, "peer_copy")):
            for mode in ("eager", "graph"):
                us = nbytes / 300e3 + (5 if mode == "eager" else 2)
                rows.append(run.result_row(peer, variant, op, nbytes, mode, 2, [[us, us * 1.1], [us * 1.05, us]],
                                           correct=peer != "nccl" or nbytes != GIB, calls_issued=40,
                                           symm_collectives=40 if peer == "symmpool" else 0))
    rows.append(run.result_row("torch-symm-mem", "_low_contention_all_gather", "all_gather", GIB, "eager", 2,
                               None, unavailable="check: rank 0: RuntimeError: out of memory"))
    return run.document({"gpu": "NVIDIA H200", "ranks": 2, "nvlink_gbps_per_direction": 478}, rows)


def test_json_rows_have_the_issue_shape(tmp_path):
    path = tmp_path / "peers_h200x2_2026-11-24.json"
    run.write_json(str(path), synthetic_document())
    doc = json.loads(path.read_text())
    assert set(doc) == {"context", "results"} and doc["context"]["nvlink_gbps_per_direction"] == 478
    required = {"peer", "variant", "op", "bytes", "mode", "time_us_median", "time_us_p10", "time_us_p90",
                "busbw_gbps", "algbw_gbps", "correct", "unavailable"}
    for r in doc["results"]:
        assert required <= r.keys()
    ran = doc["results"][0]
    us = 1024 / 300e3 + 5
    assert ran["time_us_median"] == pytest.approx((us * 1.05 + us * 1.1) / 2)  # per repetition, the slower rank
    assert ran["time_us_p10"] <= ran["time_us_median"] <= ran["time_us_p90"]
    assert ran["busbw_gbps"] == pytest.approx(ran["algbw_gbps"] / 2)
    missing = doc["results"][-1]
    assert missing["time_us_median"] is None and missing["busbw_gbps"] is None and "out of memory" in \
        missing["unavailable"]
    assert not list(tmp_path.glob("*.tmp"))


def test_plot_writes_a_png_next_to_the_json(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "peers_h200x2_2026-11-24.json"
    run.write_json(str(path), synthetic_document())
    png = plot.plot(str(path))
    assert png == str(tmp_path / "peers_h200x2_2026-11-24.png") and os.path.getsize(png) > 1000
    lines = plot.series([r for r in synthetic_document()["results"] if r["op"] == "all_gather"])
    assert ("nccl (WRONG)", "eager") in lines and ("symmpool", "graph") in lines
    assert plot.size_label(GIB) == "1G" and plot.size_label(4 * KIB) == "4K" and plot.size_label(256) == "256"


def test_the_end_of_a_run_writes_the_json_then_prints_the_summary_and_the_png(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setitem(sys.modules, "plot", plot)  # what `import plot` finds when bench/peers/run.py runs
    path = tmp_path / "peers_h200x2_2026-11-24.json"
    run.finish_run(str(path), synthetic_document(), "the table", ["nccl all_gather: wrong"], plot=True)
    assert json.loads(path.read_text()) == json.loads(json.dumps(synthetic_document()))
    assert capsys.readouterr().out.splitlines() == ["the table", "problems:", "nccl all_gather: wrong",
                                                    f"wrote {path}", f"wrote {path.with_suffix('.png')}"]
    monkeypatch.setitem(sys.modules, "plot", None)  # `import plot` fails: the run still ends, without a PNG
    run.finish_run(str(path), synthetic_document(), "the table", [], plot=True)
    out, err = capsys.readouterr()
    assert out.splitlines()[1:] == ["no problems", f"wrote {path}"] and err.startswith("no plot: ModuleNotFoundError")


def test_problems_are_wrong_results_and_calls_run_elsewhere():
    def row(peer, ran, correct=True):
        return run.result_row(peer, None, "all_gather", KIB, "eager", 2, [[1.0]], correct=correct, calls_issued=10,
                              symm_collectives=ran)
    assert run.problems([row("symmpool", 10), row("nccl", 0), row("nccl-registered", 0),
                         run.result_row("torch-symm-mem", "x", "all_gather", KIB, "graph", 2, None,
                                        unavailable="no such op")]) == []
    found = run.problems([row("symmpool", 9), row("nccl-registered", 10), row("nccl", 0, correct=False)])
    assert found == ["symmpool all_gather 1024 B eager: 9 of 10 calls ran on symmpool, expected 10",
                     "nccl-registered all_gather 1024 B eager: 10 of 10 calls ran on symmpool, expected 0",
                     "nccl all_gather 1024 B eager: result differs from NCCL's"]


def test_a_symmpool_variant_must_run_its_own_algorithm():
    def row(ran):
        return run.result_row("symmpool", "two-step 8M", "all_reduce", MIB, "eager", 2, [[1.0]], correct=True,
                              calls_issued=10, symm_collectives=10, algorithms_ran=ran)
    assert run.problems([row({"two-step": 10})]) == []
    in_place = run.result_row("symmpool", peers.ALL_GATHER_IN_PLACE, "all_gather", MIB, "eager", 2, [[1.0]],
                              correct=True, calls_issued=10, symm_collectives=10,
                              algorithms_ran={"copy-engine-push": 10})
    assert run.problems([in_place]) == []  # not named after an algorithm: any may run it
    def op(ran):
        return run.result_row("symmpool", peers.SYMMPOOL_OP, "all_reduce", KIB, "eager", 2, [[1.0]], correct=True,
                              calls_issued=10, symm_collectives=10, algorithms_ran=ran)
    assert run.problems([op({"low-latency": 10})]) == []
    in_place_op = run.result_row("symmpool", peers.SYMMPOOL_OP_IN_PLACE, "all_reduce", MIB, "eager", 2, [[1.0]],
                                 correct=True, calls_issued=10, symm_collectives=10, algorithms_ran={"two-shot": 10})
    assert run.problems([in_place_op]) == []  # the table's choice at any size
    assert run.problems([{**in_place_op, "symm_collectives": 9}]) == [
        "symmpool torch.ops.symmpool in place all_reduce 1048576 B eager: 9 of 10 calls ran on symmpool, expected 10"]
    assert run.problems([op({"two-shot": 10})]) == [
        "symmpool torch.ops.symmpool all_reduce 1024 B eager: ran {'two-shot': 10}, expected 10 x low-latency"]
    assert run.problems([row({"two-shot": 10})]) == [
        "symmpool two-step 8M all_reduce 1048576 B eager: ran {'two-shot': 10}, expected 10 x two-step"]


def test_a_graph_repetition_meets_on_the_devices_then_times_every_replay(monkeypatch):
    """Each repetition: the ranks start together, the device meeting is
    enqueued, then the start event, `replays` replays, the end event; the
    time is per captured call over all replays."""
    steps = []

    class Event:
        def __init__(self, enable_timing=False):
            self.name = "start" if not any(s.startswith("event") for s in steps) else "end"
            steps.append(f"event {self.name}")

        def record(self):
            steps.append(f"record {self.name}")

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return 2.0  # ms

    class Graph:
        def replay(self):
            steps.append("replay")

    class Capture:
        def __init__(self, graph):
            pass

        def __enter__(self):
            steps.append("capture")

        def __exit__(self, *exc):
            return False

    class Stream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: Capture(None))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", Capture)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    samples = timing.time_graph(lambda: steps.append("call"), calls=4, reps=2,
                                start_together=lambda: steps.append("start together"), replays=5,
                                meet=lambda: steps.append("meet"))
    assert samples == [2.0 * 1e3 / (4 * 5)] * 2
    timed = steps[steps.index("record start"):]
    assert timed[:8] == ["record start"] + ["replay"] * 5 + ["record end", "start together"]
    first = steps.index("record start")
    assert steps[first - 2:first] == ["start together", "meet"]  # the meeting just before the start event
    assert steps.count("meet") == 2 and steps.count("replay") == 1 + 2 * 5  # the upload replay, then 2 x 5
