"""Needs GPUs: skipped, with the reason, where there are none."""

import time

import pytest
import torch

import symmpool
from launch import gpu_count, needs_gpu, needs_two, one_gpu_only, run_sharing_one_gpu, run_workers
import dist_failures
import dist_fsdp_hooks
import dist_group_layouts
import dist_nccl_windows
import dist_workers


@needs_gpu
def test_tensors_in_the_mem_pool_come_from_symmpool():
    before = symmpool.memory_stats()
    pool = symmpool.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.randn(3, 1 << 20, device="cuda")
        y = torch.empty(5, dtype=torch.bfloat16, device="cuda")
    z = torch.randn(3, 1 << 20, device="cuda")
    assert symmpool.owns(x) and symmpool.owns(y)
    assert not symmpool.owns(z)
    torch.testing.assert_close((x * 2).cpu(), x.cpu() * 2)
    after = symmpool.memory_stats()
    assert after["allocations"] > before["allocations"]
    assert after["reserved_bytes"]["current"] >= 12 << 20
    del x, y, pool
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # PyTorch hands the pool's segments back to symmpool
    assert symmpool.memory_stats()["allocated_bytes"]["current"] == before["allocated_bytes"]["current"]
    symmpool.empty_cache()
    assert symmpool.memory_stats()["reserved_bytes"]["current"] <= before["reserved_bytes"]["current"]


@needs_gpu
def test_multicast_is_off_on_this_host():
    enabled, reason = symmpool._C.multicast_status(0)
    assert not enabled, reason


@needs_two
@pytest.mark.parametrize("collectives", ["0", "table", "always"])
def test_symm_backend_collectives_match_nccl_on_all_gpus(collectives):
    run_workers(dist_workers.symm_backend_matches_nccl, gpu_count(), collectives, timeout=400)


@needs_two
@pytest.mark.parametrize("collectives,warm_up", [("0", True), ("always", True), ("0", False), ("always", False)])
def test_symm_collectives_replay_in_a_cuda_graph(collectives, warm_up):
    run_workers(dist_workers.symm_collectives_replay_in_a_cuda_graph, gpu_count(), collectives,
                warm_up, timeout=300)


@needs_two
def test_a_symm_tensor_freed_in_a_capture_stays_with_the_graph():
    run_workers(dist_workers.symm_tensor_freed_in_a_capture_stays_with_the_graph, gpu_count(), timeout=120)


@needs_two
def test_async_work_orders_other_streams_after_the_collective():
    run_workers(dist_workers.async_work_orders_other_streams_after_the_collective, gpu_count(), timeout=120)


@needs_two
def test_routing_decisions_are_counted_by_reason_and_traced():
    run_workers(dist_workers.routing_decisions_are_counted_and_traced, gpu_count(), timeout=120)


@needs_two
@pytest.mark.parametrize("collectives", ["0", "table", "always"])
def test_fsdp2_losses_match_with_symm_allocation(collectives):
    run_workers(dist_workers.fsdp2_loss_parity, gpu_count(), 20, collectives, timeout=400)


@needs_two
@pytest.mark.parametrize("collectives", ["table", "always"])
def test_fsdp2_hsdp_on_a_2d_mesh_matches_with_symm_allocation(collectives):
    # 2 replicas: a (2, 1) mesh on 2 GPUs, (2, 2) on 4, (2, 4) on 8
    run_workers(dist_workers.fsdp2_loss_parity, gpu_count(), 20, collectives, 2, timeout=400)


@needs_two
@pytest.mark.parametrize("default_backend", ["symm", "nccl"])
def test_several_symm_groups_share_the_gpus(default_backend):
    run_workers(dist_group_layouts.several_symm_groups_share_the_gpus, gpu_count(), default_backend, timeout=300)


@needs_two
def test_device_mesh_dims_of_a_symm_group_are_symm():
    run_workers(dist_group_layouts.device_mesh_dims_of_a_symm_group_are_symm, gpu_count(), timeout=200)


@needs_two
def test_a_group_spanning_nodes_runs_on_nccl():
    run_workers(dist_group_layouts.a_group_spanning_nodes_runs_on_nccl, gpu_count(), timeout=200)


@needs_gpu
def test_blocking_wait_times_out_and_waits():
    run_workers(dist_workers.blocking_wait_times_out_and_waits, gpu_count(), timeout=120)


@needs_two
def test_a_heap_that_did_not_form_stays_failed():
    run_workers(dist_workers.a_heap_that_did_not_form_stays_failed, gpu_count(), timeout=120)


@needs_two
def test_a_late_peer_times_out_with_the_group_timeout():
    run_workers(dist_workers.late_peer_times_out_with_the_group_timeout, gpu_count(), timeout=120)


@needs_two
@pytest.mark.parametrize("blocking_wait", [False, True])
def test_a_dead_peer_makes_every_survivor_raise(blocking_wait):
    run_workers(dist_failures.dead_peer_raises_on_every_survivor, gpu_count(), blocking_wait, timeout=120)


@needs_two
def test_abort_returns_while_an_nccl_collective_waits_for_a_dead_peer():
    run_workers(dist_failures.abort_with_nccl_stuck_on_a_dead_peer, gpu_count(), timeout=120)


@needs_two
def test_registration_hooks_leave_a_communicator_the_watchdog_aborted_alone():
    run_workers(dist_failures.a_communicator_the_watchdog_aborted_is_left_alone, gpu_count(), timeout=120)


@needs_two
def test_a_dead_peer_aborts_survivors_by_default(tmp_path):
    import signal
    from launch import start_workers

    world = gpu_count()
    ctx = start_workers(dist_failures.dead_peer_aborts_by_default, world, str(tmp_path), timeout=120)
    deadline = time.monotonic() + 120
    while any(p.is_alive() for p in ctx.processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    ended = time.time()
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    for rank in range(world - 1):
        # A worker that failed before it redirected stderr left no file: say how it ended.
        assert (tmp_path / f"rank{rank}.err").exists(), (rank, ctx.processes[rank].exitcode)
        err = (tmp_path / f"rank{rank}.err").read_text()
        assert ctx.processes[rank].exitcode == -signal.SIGABRT, (ctx.processes[rank].exitcode, err)
        assert f"rank {world - 1} did not arrive within {dist_failures.TIMEOUT_S} s" in err, err
        assert "aborting the process" in err, err
        started = float((tmp_path / f"rank{rank}.start").read_text())
        assert ended - started <= dist_failures.TIMEOUT_S + 1.5, ended - started


@needs_two
def test_an_asymmetric_user_allocation_keeps_collectives_correct():
    run_workers(dist_failures.asymmetric_user_allocation_keeps_collectives_correct, gpu_count(), timeout=200)


# Two-shot checks its buffers (an exchange that carries the call number);
# low-latency checks none: only the call-number check that follows a call
# run elsewhere tells the ranks' differing calls apart.
@needs_two
@pytest.mark.parametrize("algorithm", ["two-shot", "low-latency"])
def test_a_plain_tensor_on_one_rank_fails_every_rank_loudly(algorithm, monkeypatch):
    monkeypatch.setenv("SYMMPOOL_ALL_REDUCE_ALGORITHM", algorithm)
    run_workers(dist_failures.plain_tensor_on_one_rank_fails_loudly, gpu_count(), timeout=120)


@needs_two
def test_wait_with_a_timeout_blocks_the_host():
    run_workers(dist_failures.wait_with_a_timeout_blocks_the_host, gpu_count(), timeout=120)


@needs_two
@pytest.mark.parametrize("case", sorted(dist_failures.DIFFERING_SETTINGS))
def test_differing_settings_fail_to_form_naming_the_setting(case):
    run_workers(dist_failures.differing_settings_fail_to_form, 2, case, timeout=120)


@needs_two
def test_tensors_on_two_devices_are_refused_by_name():
    run_workers(dist_failures.tensors_on_two_devices_are_refused, gpu_count(), timeout=120)


# Where one GPU is all there is, the failure tests run with both ranks on it.
@one_gpu_only
@pytest.mark.parametrize("worker, args", [
    (dist_workers.a_heap_that_did_not_form_stays_failed, ()),
    (dist_workers.late_peer_times_out_with_the_group_timeout, ()),
    (dist_failures.dead_peer_raises_on_every_survivor, (False,)),
    (dist_failures.dead_peer_raises_on_every_survivor, (True,)),
    (dist_failures.wait_with_a_timeout_blocks_the_host, ()),
    (dist_failures.differing_settings_fail_to_form, ("preferences",)),
    (dist_failures.differing_settings_fail_to_form, ("pieces",)),
    (dist_failures.differing_settings_fail_to_form, ("routing",)),
], ids=["heap_not_formed", "late_peer", "dead_peer", "dead_peer_blocking_wait", "wait_timeout",
        "differing_preferences", "differing_pieces", "differing_routing"])
def test_two_ranks_sharing_one_gpu(worker, args):
    run_sharing_one_gpu(worker, 2, *args, timeout=120)


# One rank per GPU, any number of GPUs (one is enough: NCCL's window path
# with a group of one; NCCL refuses two ranks on one GPU).
@needs_gpu
def test_nccl_windows_match_nccl_and_go_with_the_group():
    run_workers(dist_nccl_windows.windows_match_nccl_and_go_with_the_group, gpu_count(), timeout=300)


# symmpool.fsdp.enable on a plain "nccl" job, one rank per GPU (NCCL refuses
# two ranks on one GPU: stock FSDP2, the reference, needs it).
@needs_gpu
@pytest.mark.parametrize("collectives,reshard,compiled", [("always", True, False), ("table", False, False),
                                                         ("always", False, True)])
def test_fsdp2_hooks_on_a_plain_nccl_mesh_match_stock(collectives, reshard, compiled):
    run_workers(dist_fsdp_hooks.hooked_losses_match_stock, gpu_count(), collectives, reshard, compiled,
                timeout=400)


# The hooks' collectives on a plain "nccl" group run on symmpool: on every
# GPU, or with two ranks sharing the one GPU (NCCL is never called).
# HSDP's placement over two simulated hosts: four ranks on GPU 0 (only
# symmpool runs), on any machine with a GPU.
@needs_gpu
@pytest.mark.parametrize("layout", ["shard-in-host", "shard-across-hosts"])
def test_hsdp_hooks_run_on_symmpool_within_a_host_and_on_nccl_across(layout):
    run_sharing_one_gpu(dist_fsdp_hooks.hsdp_placement_with_simulated_hosts, 4, layout, timeout=300)


@needs_gpu
def test_fsdp2_hook_collectives_on_a_plain_nccl_group_match_gloo():
    if gpu_count() >= 2:
        run_workers(dist_fsdp_hooks.hook_collectives_match_gloo, gpu_count(), timeout=300)
    else:
        run_sharing_one_gpu(dist_fsdp_hooks.hook_collectives_match_gloo, 2, timeout=300)
