"""torch.ops.symmpool.*: fake implementations trace under torch.compile, and
the ops compute the right thing on a one-rank gloo group (no GPU needed)."""

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

import symmpool  # noqa: F401  (registers the ops)


@pytest.fixture(scope="module")
def group_name():
    store = dist.HashStore()
    dist.init_process_group("gloo", rank=0, world_size=1, store=store)
    yield dist.group.WORLD.group_name
    dist.destroy_process_group()


def test_ops_are_registered():
    for name in ("all_gather", "reduce_scatter", "all_reduce", "all_reduce_"):
        assert hasattr(torch.ops.symmpool, name), name


def test_schemas_take_group_size_as_c10d_functional_does():
    ops = torch.ops.symmpool
    assert str(ops.all_gather.default._schema) == \
        "symmpool::all_gather(Tensor input, int group_size, str group_name) -> Tensor"
    assert str(ops.reduce_scatter.default._schema) == \
        "symmpool::reduce_scatter(Tensor input, str op, int group_size, str group_name) -> Tensor"
    assert str(ops.all_reduce.default._schema) == \
        "symmpool::all_reduce(Tensor input, str op, str group_name) -> Tensor"
    # Returns nothing: torch.compile functionalizes a custom op that mutates
    # an input only if it returns no alias of it.
    assert str(ops.all_reduce_.default._schema) == \
        "symmpool::all_reduce_(Tensor(a!) input, str op, str group_name) -> ()"


def test_fake_implementations_give_shapes(group_name):
    with FakeTensorMode():
        x = torch.empty(6, 3, dtype=torch.bfloat16)
        assert torch.ops.symmpool.all_gather(x, 1, group_name).shape == (6, 3)
        assert torch.ops.symmpool.reduce_scatter(x, "sum", 1, group_name).shape == (6, 3)
        assert torch.ops.symmpool.all_reduce(x, "avg", group_name).dtype == torch.bfloat16


def test_fake_shapes_come_from_group_size_not_the_group(group_name):
    # A one-rank group, shapes for three: the group is never asked.
    with FakeTensorMode():
        x = torch.empty(6, 3)
        assert torch.ops.symmpool.all_gather(x, 3, group_name).shape == (18, 3)
        assert torch.ops.symmpool.reduce_scatter(x, "avg", 3, group_name).shape == (2, 3)
        assert torch.ops.symmpool.all_gather(x, 3, "no such group").shape == (18, 3)
        with pytest.raises(ValueError, match="not divisible by group_size 4"):
            torch.ops.symmpool.reduce_scatter(x, "sum", 4, group_name)


@pytest.mark.parametrize("fake", [True, False])
@pytest.mark.parametrize("group_size", [0, -2])
def test_group_size_below_one_is_rejected(group_name, group_size, fake):
    with FakeTensorMode() if fake else contextlib.nullcontext():
        x = torch.ones(4, 2)
        with pytest.raises(ValueError, match=f"all_gather: group_size must be >= 1, got {group_size}"):
            torch.ops.symmpool.all_gather(x, group_size, group_name)
        with pytest.raises(ValueError, match=f"reduce_scatter: group_size must be >= 1, got {group_size}"):
            torch.ops.symmpool.reduce_scatter(x, "sum", group_size, group_name)


def test_group_size_other_than_the_groups_is_rejected(group_name):
    x = torch.ones(4, 2)
    with pytest.raises(ValueError, match=r"symmpool::all_gather: group_size=2 but group '.*' has 1 ranks"):
        torch.ops.symmpool.all_gather(x, 2, group_name)
    with pytest.raises(ValueError, match=r"symmpool::reduce_scatter: group_size=2 but group '.*' has 1 ranks"):
        torch.ops.symmpool.reduce_scatter(x, "sum", 2, group_name)


def test_eager_results_on_one_rank(group_name):
    x = torch.randn(5, 4)
    torch.testing.assert_close(torch.ops.symmpool.all_gather(x, 1, group_name), x)
    torch.testing.assert_close(torch.ops.symmpool.reduce_scatter(x, "sum", 1, group_name), x)
    y = torch.ops.symmpool.all_reduce(x, "avg", group_name)
    torch.testing.assert_close(y, x)
    assert y.data_ptr() != x.data_ptr(), "functional: a new tensor"


def test_bad_reduction_is_rejected(group_name):
    with pytest.raises(ValueError, match="'sum' or 'avg'"):
        torch.ops.symmpool.all_reduce(torch.ones(2), "max", group_name)
    with pytest.raises(ValueError, match="'sum' or 'avg'"):
        torch.ops.symmpool.all_reduce_(torch.ones(2), "max", group_name)


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_in_place_all_reduce_writes_its_input_and_bumps_its_version(group_name, op):
    x = torch.randn(5, 4)
    kept, ptr, version = x.clone(), x.data_ptr(), x._version
    assert torch.ops.symmpool.all_reduce_(x, op, group_name) is None
    torch.testing.assert_close(x, kept)  # one rank: the sum and the mean are the input
    assert x.data_ptr() == ptr, "in place: no new tensor"
    assert x._version > version, "autograd must see the change"


def test_in_place_all_reduce_takes_a_tensor_that_is_not_contiguous(group_name):
    base = torch.randn(4, 6)
    x = base.t()  # a view, not contiguous: reduced through a copy, written back into it
    kept = x.clone()
    torch.ops.symmpool.all_reduce_(x, "avg", group_name)
    torch.testing.assert_close(x, kept)
    assert x.data_ptr() == base.data_ptr() and not x.is_contiguous()


def test_in_place_all_reduce_traces_under_torch_compile(group_name):
    def step(x):
        y = x * 2
        torch.ops.symmpool.all_reduce_(y, "sum", group_name)
        return y + 1

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    x = torch.randn(8, 2)
    torch.testing.assert_close(compiled(x), step(x))


def test_backward_through_an_in_place_all_reduce_raises(group_name):
    x = torch.randn(4, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        torch.ops.symmpool.all_reduce_(x, "sum", group_name)
    y = x * 2
    torch.ops.symmpool.all_reduce_(y, "sum", group_name)
    with pytest.raises(RuntimeError, match="not implemented"):
        y.sum().backward()


def test_traces_under_torch_compile(group_name):
    def step(x):
        g = torch.ops.symmpool.all_gather(x * 2, 1, group_name)
        return torch.ops.symmpool.all_reduce(g + 1, "sum", group_name)

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    x = torch.randn(8, 2)
    torch.testing.assert_close(compiled(x), step(x))


def test_ops_trace_where_only_pt2_compliant_ops_may(group_name):
    # custom_op tagged its ops pt2_compliant; the define/impl registration
    # must too, or Dynamo breaks the graph at them under this setting (and
    # fullgraph=True fails).
    def step(x, w):
        full, (h,) = torch.ops.symmpool.fused_all_gather_matmul(x, [w], 0, 1, group_name)
        return torch.ops.symmpool.all_reduce(full + h.sum(), "sum", group_name)

    x, w = torch.randn(4, 3), torch.randn(3, 2)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(only_allow_pt2_compliant_ops=True):
        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(x, w), step(x, w))


@pytest.mark.parametrize("op, args", [
    ("all_reduce", ("sum",)),
    ("fused_matmul_reduce_scatter", (torch.randn(3, 5), "sum", 0, 1)),
])
def test_backward_through_an_op_raises(group_name, op, args):
    # No op has an autograd formula: a backward through one must fail
    # loudly, never hand back silently missing gradients. (Registered with
    # torch.library.define and impl since custom_op's layers cost ~100 us a
    # fused call; the Autograd kernel symmpool._C registers keeps this.)
    x = torch.randn(4, 3, requires_grad=True)
    out = getattr(torch.ops.symmpool, op)(x, *args, group_name)
    assert out.requires_grad
    with pytest.raises(RuntimeError, match="not implemented"):
        out.sum().backward()


@pytest.mark.parametrize("op, args", [
    ("all_gather", (1,)),
    ("reduce_scatter", ("sum", 1)),
    ("all_reduce", ("sum",)),
])
def test_opcheck(group_name, op, args):
    # opcheck's default tests, all of them (schema, autograd registration, fake
    # tensor, AOT dispatch with dynamic shapes). The input needs no grad: the
    # ops have no autograd formula, so test_aot_dispatch_dynamic would fail
    # backward through them by design. On one rank group_size is 1, so a fake
    # kernel that ignored it would pass here: the test above covers that.
    x = torch.randn(4, 3)
    torch.library.opcheck(getattr(torch.ops.symmpool, op).default, (x, *args, group_name))


def test_opcheck_in_place(group_name):
    torch.library.opcheck(torch.ops.symmpool.all_reduce_.default, (torch.randn(4, 3), "sum", group_name))


WORKER = Path(__file__).with_name("compile_cache_worker.py")


def _run_ranks(world: int, tmp_path: Path, env: dict, timeout: float = 120.0) -> None:
    """compile_cache_worker.py on `world` ranks (a file store, so parallel
    test runs do not meet); stops them all at the first failure."""
    store, logs = tmp_path / f"store{world}", [tmp_path / f"world{world}_rank{r}.log" for r in range(world)]
    procs = []
    for rank, log in enumerate(logs):
        with open(log, "w") as out:
            procs.append(subprocess.Popen([sys.executable, str(WORKER), str(rank), str(world), str(store)],
                                          env=env, stdout=out, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs) and not any(p.returncode for p in procs):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {rank} of {world} (exit {p.returncode}):\n{log.read_text()[-4000:]}"


def test_compiled_graph_for_two_ranks_is_not_reused_on_one(tmp_path):
    # Issue 16: fake kernels that read the group size from the group name
    # made the compiled graph depend on something outside its cache key, and
    # a 1-rank run got the graph compiled for 2 ranks from the FX graph /
    # AOTAutograd caches ("expected size 6==12 ... symmpool.all_gather").
    # Inductor, because aot_eager uses neither cache.
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               TORCHINDUCTOR_FX_GRAPH_CACHE="1", TORCHINDUCTOR_AUTOGRAD_CACHE="1")
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    _run_ranks(2, tmp_path, env)
    _run_ranks(1, tmp_path, env)
