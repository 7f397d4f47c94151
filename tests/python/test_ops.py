"""torch.ops.symmpool.*: fake implementations trace under torch.compile, and
the ops compute the right thing on a one-rank gloo group (no GPU needed)."""

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
    for name in ("all_gather", "reduce_scatter", "all_reduce"):
        assert hasattr(torch.ops.symmpool, name), name


def test_fake_implementations_give_shapes(group_name):
    with FakeTensorMode():
        x = torch.empty(6, 3, dtype=torch.bfloat16)
        assert torch.ops.symmpool.all_gather(x, 1, group_name).shape == (6, 3)
        assert torch.ops.symmpool.reduce_scatter(x, "sum", 1, group_name).shape == (6, 3)
        assert torch.ops.symmpool.all_reduce(x, "avg", group_name).dtype == torch.bfloat16


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


def test_traces_under_torch_compile(group_name):
    def step(x):
        g = torch.ops.symmpool.all_gather(x * 2, 1, group_name)
        return torch.ops.symmpool.all_reduce(g + 1, "sum", group_name)

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    x = torch.randn(8, 2)
    torch.testing.assert_close(compiled(x), step(x))


def test_opcheck(group_name):
    x = torch.randn(4, 3)
    torch.library.opcheck(torch.ops.symmpool.all_gather.default, (x, 1, group_name),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.symmpool.all_reduce.default, (x, "sum", group_name),
                          test_utils=("test_schema", "test_faketensor"))
