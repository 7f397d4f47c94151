"""Fused tensor-parallel ops and the peer-memory API, on "symm" groups and
plain "nccl" ones. Schemas, fake kernels, opcheck and the unfused fallback
run here on gloo (CPU); the fused paths, graphs, compile and signals need a
GPU (two ranks share one where there is only one) and skip without."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

import symmpool
import dist_tp_ops
from launch import gpu_count, needs_gpu, needs_two, one_gpu_only, run_sharing_one_gpu, run_workers

OPS = ("fused_all_gather_matmul", "fused_matmul_reduce_scatter", "pipelined_produce_and_all_to_all")


@pytest.fixture(scope="module")
def group_name():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield dist.group.WORLD.group_name
    dist.destroy_process_group()


@pytest.mark.parametrize("value, expected", [(None, 4 << 20), ("0", 0), ("65536", 65536), ("lots", None),
                                             ("-1", None), ("12 MiB", None)])
def test_one_shot_bytes_setting_is_read_or_refused(value, expected):
    env = {k: v for k, v in os.environ.items() if k != "SYMMPOOL_TP_ONE_SHOT_BYTES"}
    if value is not None:
        env["SYMMPOOL_TP_ONE_SHOT_BYTES"] = value
    done = subprocess.run([sys.executable, "-c", "import symmpool; print(symmpool._C._tp_one_shot_bytes())"],
                          env=env, capture_output=True, text=True, timeout=120)
    if expected is None:
        assert done.returncode != 0 and "ValueError: SYMMPOOL_TP_ONE_SHOT_BYTES must be" in done.stderr, done.stderr
    else:
        assert done.returncode == 0 and int(done.stdout.split()[-1]) == expected, done.stderr


def test_every_op_takes_the_group_size_its_shapes_depend_on():
    for name in OPS:
        schema = getattr(torch.ops.symmpool, name).default._schema
        assert [a.name for a in schema.arguments][-2:] == ["group_size", "group_name"], str(schema)
        assert str(schema.arguments[-2].type) == "int", str(schema)


def test_fake_kernels_take_shapes_from_group_size_alone(group_name):
    # group_size 4 on a one-rank group: the fake kernels never ask the group.
    with FakeTensorMode():
        A, (o1, o2) = torch.ops.symmpool.fused_all_gather_matmul(
            torch.empty(3, 5, 16), [torch.empty(16, 7), torch.empty(16, 9)], 1, 4, group_name)
        assert A.shape == (3, 20, 16) and o1.shape == (3, 20, 7) and o2.shape == (3, 20, 9)
        A, (o,) = torch.ops.symmpool.fused_all_gather_matmul(torch.empty(6, 8), [torch.empty(32, 5)], -1, 4,
                                                             group_name)
        assert A.shape == (6, 32) and o.shape == (6, 5)
        out = torch.ops.symmpool.fused_matmul_reduce_scatter(torch.empty(2, 8, 16), torch.empty(16, 12), "sum",
                                                             1, 4, group_name)
        assert out.shape == (2, 2, 12)
        out = torch.ops.symmpool.fused_matmul_reduce_scatter(torch.empty(8, 16), torch.empty(16, 12), "avg",
                                                             -1, 4, group_name)
        assert out.shape == (8, 3)
        out = torch.ops.symmpool.pipelined_produce_and_all_to_all(torch.empty(8, 16), torch.empty(16, 12), 4,
                                                                  group_name)
        assert out.shape == (8, 12)


def test_bad_arguments_are_named(group_name):
    with pytest.raises(ValueError, match="group_size is 2 but group"):
        torch.ops.symmpool.fused_all_gather_matmul(torch.ones(4, 4), [torch.ones(4, 4)], 0, 2, group_name)
    with pytest.raises(ValueError, match="every B must be"):
        torch.ops.symmpool.fused_all_gather_matmul(torch.ones(4, 4), [torch.ones(5, 4)], 0, 1, group_name)
    with pytest.raises(ValueError, match="on cpu, got torch.float32 \\(4, 4\\) on meta"):
        torch.ops.symmpool.fused_all_gather_matmul(torch.ones(4, 4), [torch.ones(4, 4, device="meta")], 0, 1,
                                                   group_name)
    with pytest.raises(ValueError, match="gather_dim 2 is out of range"):
        torch.ops.symmpool.fused_all_gather_matmul(torch.ones(4, 4), [torch.ones(4, 4)], 2, 1, group_name)
    with pytest.raises(ValueError, match="'sum' or 'avg'"):
        torch.ops.symmpool.fused_matmul_reduce_scatter(torch.ones(4, 4), torch.ones(4, 4), "max", 0, 1,
                                                       group_name)
    with FakeTensorMode(), pytest.raises(ValueError, match=r"\(5\) is not divisible by the group size 2"):
        torch.ops.symmpool.fused_matmul_reduce_scatter(torch.empty(5, 4), torch.empty(4, 4), "sum", 0, 2,
                                                       group_name)
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        torch.ops.symmpool.pipelined_produce_and_all_to_all(torch.ones(4, 4), torch.ones(4, 4), 0, group_name)


def test_one_rank_fallback_is_plain_matmul_and_counted(group_name):
    symmpool.reset_peer_memory_counts()
    A, B, C = torch.randn(6, 8), torch.randn(8, 5), torch.randn(5, 8)
    full, (out,) = torch.ops.symmpool.fused_all_gather_matmul(A, [B], 0, 1, group_name)
    torch.testing.assert_close(full, A)
    torch.testing.assert_close(out, A @ B)
    torch.testing.assert_close(torch.ops.symmpool.fused_matmul_reduce_scatter(out, C, "sum", 0, 1, group_name),
                               out @ C)
    torch.testing.assert_close(torch.ops.symmpool.pipelined_produce_and_all_to_all(A, B, 1, group_name), A @ B)
    counts = symmpool.peer_memory_counts()
    assert counts["fused_all_gather_matmul.fallback: CPU tensors"] == 1, counts
    assert counts["fused_matmul_reduce_scatter.fallback"] == 1, counts
    assert not any(k.endswith(".fused") for k in counts), counts


def test_fallbacks_send_complex_tensors_as_pairs_of_reals(group_name):
    # As torch.distributed does: neither NCCL nor gloo takes complex dtypes.
    A, B = torch.randn(6, 8, dtype=torch.complex64), torch.randn(8, 5, dtype=torch.complex64)
    full, (out,) = torch.ops.symmpool.fused_all_gather_matmul(A, [B], 0, 1, group_name)
    torch.testing.assert_close(full, A)
    torch.testing.assert_close(out, A @ B)
    torch.testing.assert_close(torch.ops.symmpool.pipelined_produce_and_all_to_all(A, B, 1, group_name), A @ B)
    torch.testing.assert_close(torch.ops.symmpool.all_gather(A, 1, group_name), A)
    torch.testing.assert_close(torch.ops.symmpool.all_reduce(A, "sum", group_name), A)


def test_opcheck(group_name):
    A, B = torch.randn(6, 8), torch.randn(8, 4)
    cases = {
        "fused_all_gather_matmul": (A, [B, B * 2], 0, 1, group_name),
        "fused_matmul_reduce_scatter": (A, B, "sum", 1, 1, group_name),
        "pipelined_produce_and_all_to_all": (A, B, 1, group_name),
    }
    for name, args in cases.items():
        torch.library.opcheck(getattr(torch.ops.symmpool, name).default, args)


def test_traces_under_torch_compile(group_name):
    def step(a, b, c):
        full, (h,) = torch.ops.symmpool.fused_all_gather_matmul(a, [b], 0, 1, group_name)
        return full, torch.ops.symmpool.fused_matmul_reduce_scatter(h, c, "sum", 0, 1, group_name)

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    a, b, c = torch.randn(4, 6), torch.randn(6, 3), torch.randn(3, 5)
    for got, want in zip(compiled(a, b, c), step(a, b, c)):
        torch.testing.assert_close(got, want)


def test_peer_memory_needs_an_nccl_or_symm_group(group_name):
    with pytest.raises(TypeError, match='rendezvous needs a group whose CUDA backend is "nccl" or "symm"'):
        symmpool.rendezvous(torch.ones(4))
    with pytest.raises(TypeError, match='peer_tensor needs a group whose CUDA backend is "nccl" or "symm"'):
        symmpool.peer_tensor(torch.ones(4), 0)
    with pytest.raises(TypeError, match='reserve_workspace needs a group whose CUDA backend is "nccl" or "symm"'):
        symmpool.reserve_workspace(1 << 20, device=0)
    assert not symmpool.is_available(device=0)


def test_fallback_on_two_gloo_ranks_matches_the_unfused_ops(tmp_path):
    run_workers(dist_tp_ops.fused_ops_match_unfused, 2, False, [torch.float32, torch.bfloat16],
                str(tmp_path / "store"), timeout=240)


# SYMMPOOL_TP_ONE_SHOT_BYTES: "" (the default: small calls in one step) or "0" (every call pipelined).
ONE_SHOT = pytest.mark.parametrize("one_shot_bytes", ["", "0"], ids=["default", "pipelined"])


@needs_two
@ONE_SHOT
@pytest.mark.parametrize("backend", [dist_tp_ops.SYMM, dist_tp_ops.NCCL], ids=["symm", "nccl"])
def test_fused_ops_match_nccl_in_every_dtype(backend, one_shot_bytes):
    run_workers(dist_tp_ops.fused_ops_match_unfused, gpu_count(), True,
                [torch.bfloat16, torch.float16, torch.float32], "", backend, one_shot_bytes, timeout=300)


@needs_gpu
def test_a_reserved_workspace_is_kept():
    run_workers(dist_tp_ops.a_reserved_workspace_is_kept, 1, timeout=120)


@needs_gpu
def test_a_destroyed_groups_workspace_is_freed():
    run_workers(dist_tp_ops.a_destroyed_groups_workspace_is_freed, 1, timeout=120)


@needs_two
def test_a_destroyed_groups_workspace_is_freed_on_every_rank():
    run_workers(dist_tp_ops.a_destroyed_groups_workspace_is_freed, gpu_count(), timeout=120)


@needs_two
@ONE_SHOT
@pytest.mark.parametrize("backend", [dist_tp_ops.SYMM, dist_tp_ops.NCCL], ids=["symm", "nccl"])
def test_fused_ops_replay_in_cuda_graphs_and_compile(backend, one_shot_bytes):
    run_workers(dist_tp_ops.fused_ops_replay_in_cuda_graphs_and_compile, gpu_count(), backend, one_shot_bytes,
                timeout=300)


@needs_two
def test_fused_ops_back_to_back_with_a_late_rank_on_two_streams():
    run_workers(dist_tp_ops.fused_ops_back_to_back_with_a_late_rank, gpu_count(), timeout=300)


@needs_two
def test_fused_ops_on_a_plain_nccl_group():
    run_workers(dist_tp_ops.fused_ops_on_an_nccl_group_and_nccl_fallbacks, gpu_count(), timeout=120)


@needs_two
@pytest.mark.parametrize("backend", [dist_tp_ops.SYMM, dist_tp_ops.NCCL], ids=["symm", "nccl"])
def test_peer_memory_api(backend):
    run_workers(dist_tp_ops.peer_memory_api, gpu_count(), backend, timeout=120)


@needs_two
def test_a_peer_view_outlives_its_group():
    run_workers(dist_tp_ops.peer_view_outlives_its_group, gpu_count(), timeout=120)


@needs_two
def test_a_group_formed_in_a_capture_leaves_retired_mappings_for_later():
    run_workers(dist_tp_ops.a_group_formed_in_a_capture_leaves_retired_mappings_for_later, gpu_count(),
                timeout=120)


@needs_two
def test_a_wait_without_signal_times_out():
    run_workers(dist_tp_ops.a_wait_without_signal_times_out, 2, timeout=120)


@needs_two
def test_a_signal_before_setup_is_refused():
    run_workers(dist_tp_ops.signal_before_setup_is_refused, 2, timeout=120)


@needs_two
def test_a_wait_the_gpu_has_not_reached_does_not_time_out():
    run_workers(dist_tp_ops.a_wait_the_gpu_has_not_reached_does_not_time_out, 2, timeout=120)


@one_gpu_only
@pytest.mark.parametrize("worker, args", [
    ("fused_ops_match_unfused", (True, [torch.bfloat16, torch.float16, torch.float32])),
    ("fused_ops_match_unfused", (True, [torch.bfloat16, torch.float16, torch.float32], "", dist_tp_ops.NCCL)),
    ("fused_ops_match_unfused",
     (True, [torch.bfloat16, torch.float16, torch.float32], "", dist_tp_ops.SYMM, "0")),
    ("fused_ops_replay_in_cuda_graphs_and_compile", ()),
    ("fused_ops_replay_in_cuda_graphs_and_compile", (dist_tp_ops.NCCL,)),
    ("fused_ops_replay_in_cuda_graphs_and_compile", (dist_tp_ops.SYMM, "0")),
    ("fused_ops_back_to_back_with_a_late_rank", ()),
    ("peer_memory_api", ()),
    ("peer_memory_api", (dist_tp_ops.NCCL,)),
    ("peer_view_outlives_its_group", ()),
    ("a_wait_without_signal_times_out", ()),
    ("a_wait_the_gpu_has_not_reached_does_not_time_out", ()),
    ("a_destroyed_groups_workspace_is_freed", ()),
    ("signal_before_setup_is_refused", ()),
], ids=["fused_vs_unfused", "fused_vs_unfused_nccl", "fused_vs_unfused_pipelined", "graphs_and_compile",
        "graphs_and_compile_nccl", "graphs_and_compile_pipelined",
        "late_rank", "peer_memory_api", "peer_memory_api_nccl", "peer_view_outlives_group",
        "wait_timeout", "late_gpu_wait",
        "workspace_freed", "signal_before_setup"])
def test_two_ranks_sharing_one_gpu(worker, args):
    run_sharing_one_gpu(getattr(dist_tp_ops, worker), 2, *args, timeout=300)
