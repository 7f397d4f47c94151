"""The FSDP2 benchmark's driver without a GPU: names, plan, child environment,
aggregation and merge on synthetic worker outputs, the exposed-communication
arithmetic, failures and time budget, and an end-to-end 2-process stock run of
the tiny model on CPU (FSDP2 over gloo)."""

import json
import os
import pathlib
import subprocess
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "fsdp2"
sys.path.insert(0, str(BENCH))

import aggregate  # noqa: E402
import comm_profile  # noqa: E402
import configs  # noqa: E402
import host_meter  # noqa: E402
import run  # noqa: E402

REQUIRED_RUN_KEYS = {
    "mode", "reps", "steps_per_rep", "step_ms_median", "step_ms_p10", "step_ms_p90", "step_ms_rep_medians",
    "host_ms_median", "exposed_comm_ms_median", "device_peak_bytes", "device_peak_bytes_per_rep",
    "torch_peak_allocated_bytes", "torch_peak_reserved_bytes", "symmpool_peak_reserved_bytes",
    "max_rel_loss_diff_vs_stock", "failures",
}
REQUIRED_MODEL_KEYS = {"preset", "params", "layers", "dim", "mlp", "heads", "vocab", "batch", "seq"}


def fake_result(step_ms, losses, peak, world=2, symm=None, exposed=1.5):
    """What worker.py writes, with the same numbers on every rank except the
    step times of rank 1, which are 1 ms slower (the slowest rank counts)."""
    ranks = []
    for rank in range(world):
        ranks.append({
            "rank": rank, "losses": list(losses), "step_ms": [s + rank for s in step_ms],
            "host_ms": [s / 2 for s in step_ms], "host_cpu_ms": [s / 4 + rank for s in step_ms],
            "process_cpu_ms": [s for s in step_ms], "host_voluntary_switches": [3 * rank] * len(step_ms),
            "host_involuntary_switches": [1] * len(step_ms), "gc_ms": [0.0] * len(step_ms),
            "gc_full_collections": [0] * len(step_ms), "heap_exchanges_per_step": symm and 0.5 * rank,
            "device_baseline_bytes": 1 << 30,
            "device_peak_bytes": peak - (1 << 20) * rank, "torch_peak_allocated_bytes": peak // 2,
            "torch_peak_reserved_bytes": peak // 2 + 100,
            "symmpool": symm and {"reserved_bytes": {"current": 0, "peak": symm}, "symm_collectives": 7,
                                  "nccl_fallbacks": 0},
            "profile": {"exposed_comm_ms_per_step": exposed + rank, "comm_ms_per_step": 4.0,
                        "compute_ms_per_step": 9.0, "profiled_steps": 3,
                        "exposed_longest_ms": [0.5 + rank, 0.25]},
        })
    return {"world": world, "ranks": ranks, "context": {"torch": "2.11.0", "cuda": "13.0", "nccl": "2.28.9"},
            "mode_problems": []}


def record(mode, rep, result=None, status="ok", config="3.5b-b2s2048", **extra):
    return dict({"config": config, "mode": mode, "rep": rep, "status": status, "returncode": 0 if result else 1,
                 "reason": None if result else "exit code 1", "wall_s": 10.0, "log_tail": None, "result": result},
                **extra)


LOSSES = [10.5, 10.0, 9.0]
RECORDS = [
    record("stock", 0, fake_result([100, 110, 120], LOSSES, 40 << 30)),
    record("symm", 0, fake_result([90, 95, 100], [10.5, 10.0, 9.0 * (1 + 2e-6)], 40 << 30, symm=3 << 30)),
    record("stock", 1, fake_result([105, 115, 125], LOSSES, 41 << 30)),
    record("symm", 1, None, status="failed", log_tail="RuntimeError: boom"),
    record("symm-noflag", 0, fake_result([130, 130, 130], LOSSES, 42 << 30)),
]


def test_config_names_parse_and_bad_ones_say_what_is_known():
    c = configs.parse_config("3.5b-b2s2048")
    assert (c.preset, c.batch, c.seq, c.spec.layers) == ("3.5b", 2, 2048, 16)
    for name in configs.ISSUE_CONFIGS:
        configs.parse_config(name)
    with pytest.raises(ValueError, match="unknown model preset '9b'; known: tiny"):
        configs.parse_config("9b-b2s2048")
    with pytest.raises(ValueError, match="not <preset>-b<batch>s<seq>"):
        configs.parse_config("3.5b")
    with pytest.raises(ValueError, match="unknown mode"):
        configs.parse_modes("stock,fast")
    assert configs.parse_modes("symm, stock") == ["symm", "stock"]


def test_run_rejects_bad_input_with_a_message(capsys):
    for argv, text in ([["--configs", "3.5b-b2"]], "not <preset>"), ([["--modes", "stok"]], "unknown mode"), \
                      ([["--configs", "1b-b1s64", "--preset", "1b"]], "not both"), \
                      ([["--device", "cpu", "--modes", "symm"]], "stock mode only"):
        with pytest.raises(SystemExit) as e:
            run.parse_args(*argv)
        assert e.value.code == 2
        assert text in capsys.readouterr().err


def test_preset_options_make_one_config():
    args = run.parse_args(["--preset", "1b", "--steps", "20", "--seq", "512"])
    assert [c.name for c in args.configs] == ["1b-b2s512"]
    assert run.parse_args([]).configs[0].name == configs.ISSUE_CONFIGS[0]


def test_param_counts_match_the_models_on_meta():
    import llama

    for name, spec in configs.PRESETS.items():
        model = llama.build_on_meta(name, 16)
        assert sum(p.numel() for p in model.parameters()) == configs.param_count(spec), name
    assert 0.9e9 < configs.param_count(configs.PRESETS["1b"]) < 1.1e9
    assert 3.4e9 < configs.param_count(configs.PRESETS["3.5b"]) < 3.6e9
    assert 6.5e9 < configs.param_count(configs.PRESETS["7b"]) < 7e9
    assert 3.9e9 < configs.param_count(configs.PRESETS["wide4b"]) < 4e9


def test_plan_interleaves_repetitions_and_rotates_modes():
    cs = [configs.parse_config("1b-b1s64"), configs.parse_config("tiny-b1s64")]
    order = [(rep, c.name, m) for rep, c, m in run.plan(cs, ["stock", "symm", "symm-noflag"], 2)]
    assert order[:3] == [(0, "1b-b1s64", "stock"), (0, "1b-b1s64", "symm"), (0, "1b-b1s64", "symm-noflag")]
    assert [o[0] for o in order] == [0] * 6 + [1] * 6
    assert order[6:9] == [(1, "1b-b1s64", "symm"), (1, "1b-b1s64", "symm-noflag"), (1, "1b-b1s64", "stock")]


def test_child_environment_sets_the_mode_and_keeps_multicast_off(monkeypatch):
    monkeypatch.setenv("SYMMPOOL_COLLECTIVES", "always")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    for mode, expected in [("symm", None), ("symm-always", "always"), ("symm-nccl", "0"), ("stock", None)]:
        env = run.child_env(mode)
        assert env.get("SYMMPOOL_COLLECTIVES") == expected, mode
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
        assert env["NVSHMEM_DISABLE_NVLS"] == "1"
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert run.child_env("stock")["GLIBC_TUNABLES"] == run.MALLOC_KEEPS_BUFFERS  # the same malloc in every mode
    assert "GLIBC_TUNABLES" not in run.child_env("symm", keep_malloc_buffers=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.pthread.rseq=0")  # the caller's other tunables stay beside it
    assert run.child_env("symm")["GLIBC_TUNABLES"] == "glibc.pthread.rseq=0:" + run.MALLOC_KEEPS_BUFFERS
    assert run.child_env("symm", keep_malloc_buffers=False)["GLIBC_TUNABLES"] == "glibc.pthread.rseq=0"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")  # a caller's own threshold wins
    assert run.child_env("symm")["GLIBC_TUNABLES"] == "glibc.malloc.mmap_threshold=65536"


def test_each_mode_gets_its_own_allocator(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # the caller's is dropped
    assert "PYTORCH_CUDA_ALLOC_CONF" not in run.child_env("stock")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in run.child_env("symm-global")
    assert run.child_env("stock-expandable")["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_percentile_interpolates_like_numpy():
    values = list(range(1, 11))
    assert aggregate.percentile(values, 10) == pytest.approx(1.9)
    assert aggregate.percentile(values, 90) == pytest.approx(9.1)
    assert aggregate.percentile([5.0], 90) == 5.0


def test_aggregation_has_the_issue_shape_and_numbers():
    [config] = aggregate.aggregate(RECORDS)
    assert config["name"] == "3.5b-b2s2048"
    assert REQUIRED_MODEL_KEYS <= config["model"].keys()
    assert [r["mode"] for r in config["runs"]] == ["stock", "symm", "symm-noflag"]  # MODES order
    for r in config["runs"]:
        assert REQUIRED_RUN_KEYS <= r.keys()
    stock, symm, noflag = config["runs"]
    # every measured step of every rep, the slower rank (rank 1: +1 ms)
    assert stock["reps"] == 2 and stock["steps_per_rep"] == [3]
    assert stock["step_ms_median"] == pytest.approx(113.5)
    assert stock["step_ms_p10"] == pytest.approx(aggregate.percentile([101, 111, 121, 106, 116, 126], 10))
    assert stock["step_ms_rep_medians"] == [111, 116]
    assert stock["host_ms_median"] == pytest.approx(56.25)
    assert stock["host_cpu_ms_median"] == pytest.approx(113.5 / 4 + 1 - 0.25)  # rank 1's: +1 ms
    assert stock["process_cpu_ms_median"] == pytest.approx(112.5)
    assert (stock["host_voluntary_switches_median"], stock["host_involuntary_switches_median"]) == (3, 1)
    assert stock["device_peak_bytes"] == 41 << 30 and stock["device_peak_bytes_per_rep"] == [40 << 30, 41 << 30]
    assert stock["device_peak_above_baseline_bytes"] == 40 << 30  # baseline 1 GiB
    assert stock["exposed_comm_ms_median"] == pytest.approx(2.5)  # the larger rank's
    assert stock["exposed_longest_ms_per_rep"] == [[1.5, 0.25], [1.5, 0.25]]  # that rank's stretches
    assert stock["symmpool_peak_reserved_bytes"] is None
    assert stock["max_rel_loss_diff_vs_stock"] == 0.0
    assert symm["reps"] == 1 and symm["symmpool_peak_reserved_bytes"] == 3 << 30
    assert symm["heap_exchanges_per_step_per_rep"] == [0.5] and stock["heap_exchanges_per_step_per_rep"] == [None, None]
    assert symm["max_rel_loss_diff_vs_stock"] == pytest.approx(2e-6)
    assert symm["step_vs_stock"] == pytest.approx(96 / 113.5)
    [failure] = symm["failures"]
    assert failure["rep"] == 1 and failure["status"] == "failed" and "boom" in failure["log_tail"]
    assert noflag["device_peak_vs_stock"] == pytest.approx(42 / 41)
    assert aggregate.loss_problems([config], 1e-5) == []
    assert "symm" in aggregate.loss_problems([config], 1e-6)[0]
    assert "rep 1: failed" in aggregate.failure_lines([config])[0]
    text = aggregate.table(config)
    assert "symm-noflag" in text and "113.5 [" in text
    assert stock["host_fraction"] == pytest.approx(56.25 / 113.5)
    assert aggregate.host_bound_lines([config]) == []


def test_ranks_tied_on_the_profile_still_aggregate():
    result = fake_result([100, 100, 100], LOSSES, 1 << 30)
    for r in result["ranks"]:  # equal on both ranks: the pick must not compare the dicts
        r["profile"].update(exposed_comm_ms_per_step=2.0, gpu_idle_ms_per_step=1.0,
                            host_api_ms_per_step={"cudaLaunchKernel": 7.0})
    [config] = aggregate.aggregate([record("stock", 0, result)])
    [stock] = config["runs"]
    assert stock["host_api_ms_per_rep"] == [{"cudaLaunchKernel": 7.0}] and stock["gpu_idle_ms_median"] == 1.0


def test_a_mode_whose_host_time_fills_the_step_is_reported_host_bound():
    [config] = aggregate.aggregate(RECORDS)
    stock = config["runs"][0]
    stock["host_fraction"] = 0.93
    [line] = aggregate.host_bound_lines([config])
    assert line.startswith("3.5b-b2s2048: host-bound") and "stock 93%" in line and "symm " not in line


def test_a_mode_whose_every_run_failed_is_listed_not_dropped():
    [config] = aggregate.aggregate([record("stock", 0, None, status="timeout")])
    [stock] = config["runs"]
    assert stock["reps"] == 0 and stock["step_ms_median"] is None and stock["failures"][0]["status"] == "timeout"
    assert "stock" in aggregate.table(config)


def test_documents_merge_and_machines_must_match(tmp_path):
    context = {"gpu": "h200", "ranks": 2, "device": "cuda", "date": "2026-11-23"}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    run.write_json(str(a), run.document(dict(context), RECORDS[:2], []))
    run.write_json(str(b), run.document(dict(context), RECORDS[2:], [{"config": "1.4b-b1s1024", "mode": "stock", "rep": 2,
                                                                      "reason": "time budget"}]))
    merged = run.merge([str(a), str(b)], str(tmp_path / "m.json"))
    assert json.loads((tmp_path / "m.json").read_text())["configs"] == merged["configs"]
    stock = merged["configs"][0]["runs"][0]
    assert stock["reps"] == 2 and stock["device_peak_bytes"] == 41 << 30
    assert merged["context"]["merged_from"] == ["a.json", "b.json"] and len(merged["not_run"]) == 1
    assert [r["source"] for r in merged["context"]["runs_context"]] == ["a.json", "b.json"]  # each file's context
    # Merging the merge with a file that holds the missing repetition: that
    # entry goes, and the sources stay the original files.
    c = tmp_path / "c.json"
    ran = [record("stock", r, fake_result([100, 110, 120], LOSSES, 40 << 30), config="1.4b-b1s1024") for r in range(2)]
    run.write_json(str(c), run.document(dict(context), ran, []))
    assert run.merge([str(tmp_path / "m.json"), str(c)], str(tmp_path / "m2.json"))["not_run"] != []
    ran.append(record("stock", 2, fake_result([100, 110, 120], LOSSES, 40 << 30), config="1.4b-b1s1024"))
    run.write_json(str(c), run.document(dict(context), ran, []))
    again = run.merge([str(tmp_path / "m.json"), str(c)], str(tmp_path / "m2.json"))
    assert again["not_run"] == [] and again["context"]["merged_from"] == ["a.json", "b.json", "c.json"]
    assert [r["source"] for r in again["context"]["runs_context"]] == ["a.json", "b.json", "c.json"]
    other = tmp_path / "c.json"
    run.write_json(str(other), run.document(dict(context, gpu="h100"), RECORDS[:1], []))
    with pytest.raises(SystemExit, match="its gpu is .h100."):
        run.merge([str(a), str(other)], str(tmp_path / "n.json"))
    # compiled runs, or runs with another malloc, are not the same measurement
    run.write_json(str(other), run.document(dict(context, compile="inductor"), RECORDS[:1], []))
    with pytest.raises(SystemExit, match="its compile is .inductor."):
        run.merge([str(a), str(other)], str(tmp_path / "n.json"))
    run.write_json(str(other), run.document(dict(context, env={"GLIBC_TUNABLES": run.MALLOC_KEEPS_BUFFERS}),
                                            RECORDS[:1], []))
    with pytest.raises(SystemExit, match="its GLIBC_TUNABLES is"):
        run.merge([str(a), str(other)], str(tmp_path / "n.json"))


def test_exposed_communication_is_what_no_compute_covers():
    def ev(cat, name, ts, dur, stream):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}

    events = [
        ev("kernel", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 0, 10, 20),
        ev("kernel", "void symmpool::detail::(anonymous namespace)::reduce_kernel<float>(...)", 30, 10, 20),
        ev("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", 5, 3, 7),  # covers 3 of the first 10
        ev("kernel", "elementwise_kernel", 35, 10, 7),  # covers 5 of the second 10
        ev("gpu_memcpy", "Memcpy PtoP (Device -> Device)", 50, 4, 7),  # peer copy: communication
        ev("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 60, 2, 21),  # no compute on stream 21: communication
        ev("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 70, 2, 7),  # on the compute stream: compute
        ev("gpu_memset", "Memset (Device)", 80, 1, 20),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 100},  # not on the GPU
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 3},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 9, "dur": 3},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 60, "dur": 20},
        {"ph": "X", "cat": "cuda_driver", "name": "cuMemMap", "ts": 20, "dur": 1},
    ]
    comm, compute = comm_profile.classify(events)
    assert len(comm) == 4 and len(compute) == 4
    assert comm_profile.exposed(comm, compute) == pytest.approx(7 + 5 + 4 + 2)
    summary = comm_profile.summarize(events, steps=2)
    assert summary["exposed_comm_ms_per_step"] == pytest.approx(18 / 2 / 1000)
    assert summary["comm_ms_per_step"] == pytest.approx(26 / 2 / 1000)
    assert summary["exposed_stretches_per_step"] == pytest.approx(5 / 2)  # (0,5) (8,10) (30,35) (50,54) (60,62)
    assert summary["exposed_longest_ms"] == pytest.approx([0.005, 0.005, 0.004, 0.002])
    # busy (0,10) (30,45) (50,54) (60,62) (70,72) (80,81) inside 0..81: 47 us idle
    assert summary["gpu_idle_ms_per_step"] == pytest.approx(47 / 2 / 1000)
    assert summary["host_api_ms_per_step"] == pytest.approx(
        {"cudaStreamSynchronize": 0.01, "cudaLaunchKernel": 0.003, "cuMemMap": 0.0005})
    assert list(summary["host_api_ms_per_step"]) == ["cudaStreamSynchronize", "cudaLaunchKernel", "cuMemMap"]
    assert comm_profile.exposed([(0, 10)], [(0, 4), (2, 6), (8, 20)]) == pytest.approx(2)
    assert comm_profile.exposed_intervals([(0, 10), (12, 20)], [(2, 4), (5, 13), (15, 16)]) == \
        [(0, 2), (4, 5), (13, 15), (16, 20)]


def test_exposed_communication_is_split_by_whether_the_host_had_launched_the_next_compute():
    def gpu(cat, name, ts, dur, stream, correlation):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur,
                "args": {"stream": stream, "correlation": correlation}}

    def launch(ts, correlation):
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2,
                "args": {"correlation": correlation}}

    events = [
        gpu("kernel", "ncclDevKernel_AllGather", 0, 30, 20, 1),  # exposed 0..10 and 20..30
        gpu("kernel", "sm90_gemm", 10, 10, 7, 2), launch(1, 2),  # host late 0..1, then waited on the comm
        gpu("kernel", "elementwise_kernel", 30, 5, 7, 3), launch(26, 3),  # launched at 26: host late 20..26
        gpu("kernel", "ncclDevKernel_ReduceScatter", 40, 8, 20, 4),  # exposed 40..48, nothing after it
    ]
    summary = comm_profile.summarize(events, steps=1)
    assert summary["exposed_comm_ms_per_step"] == pytest.approx(0.028)
    assert summary["exposed_host_late_ms_per_step"] == pytest.approx(0.001 + 0.006)
    assert summary["exposed_comm_bound_ms_per_step"] == pytest.approx(0.009 + 0.004)
    assert summary["exposed_unattributed_ms_per_step"] == pytest.approx(0.008)
    # a trace without launch calls (older torch) attributes nothing
    bare = [e for e in events if e["cat"] != "cuda_runtime"]
    assert comm_profile.exposed_by_cause(bare, [(0.0, 10.0)]) == {
        "host_late_us": 0.0, "comm_bound_us": 0.0, "unattributed_us": 10.0}
    # a launch after the stretch ended makes it all host-late; compute after an idle gap still decides;
    # items starting together, one without a correlation id, do not break the sort
    later = [gpu("kernel", "ncclDevKernel_AllGather", 0, 10, 20, 1),
             gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 15, 1, 7, 2), launch(12, 2),
             {"ph": "X", "cat": "kernel", "name": "elementwise_kernel", "ts": 15, "dur": 1, "args": {}}]
    assert comm_profile.exposed_by_cause(later, [(0.0, 10.0)]) == {
        "host_late_us": 10.0, "comm_bound_us": 0.0, "unattributed_us": 0.0}


def test_exposed_communication_is_split_by_the_collectives_running_then():
    def ev(cat, name, ts, dur, stream):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}

    events = [
        ev("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 0, 20, 30),  # all-gather stream: copies...
        ev("kernel", "void symmpool::detail::barrier_kernel(...)", 20, 5, 30),  # ...and its barrier
        ev("kernel", "void symmpool::detail::reduce_kernel<float>(...)", 10, 30, 31),  # reduce-scatter stream
        ev("kernel", "sm90_gemm", 0, 5, 7),  # compute covers 0..5
        ev("kernel", "void symmpool::detail::barrier_kernel(...)", 50, 4, 32),  # a stream with no named item
    ]
    comm, compute = comm_profile.classify(events)
    stretches = comm_profile.exposed_intervals(comm, compute)
    assert stretches == [(5, 40), (50, 54)]
    assert comm_profile.exposed_by_collective(events, stretches) == pytest.approx(
        {"all_gather": 5.0, "both": 15.0, "reduction": 15.0, "other": 4.0})  # 5..10, 10..25, 25..40, 50..54
    assert comm_profile.summarize(events, steps=1)["exposed_by_collective_ms_per_step"] == pytest.approx(
        {"all_gather": 0.005, "both": 0.015, "reduction": 0.015, "other": 0.004})
    # a named kernel keeps its own kind on a stream of the other; a copy takes its stream's
    mixed = [ev("kernel", "ncclDevKernel_AllGather_RING_LL", 0, 10, 40),
             ev("kernel", "ncclDevKernel_ReduceScatter_Sum_f32", 10, 10, 40),
             ev("kernel", "ncclDevKernel_ReduceScatter_Sum_f32", 20, 10, 40),
             ev("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 30, 10, 40)]
    assert comm_profile.exposed_by_collective(mixed, [(0.0, 40.0)]) == pytest.approx(
        {"all_gather": 10.0, "both": 0.0, "reduction": 30.0, "other": 0.0})


def test_host_meter_splits_the_host_by_thread_name_and_times_the_collector():
    import gc

    before = {1: ("python3", 1_000_000, 0, 10), 2: ("pt_autograd_0", 5_000_000, 1_000_000, 100)}
    after = {1: ("python3", 3_000_000, 500_000, 10), 2: ("pt_autograd_0", 45_000_000, 1_000_000, 1700),
             3: ("pt_autograd_0", 2_000_000, 0, 5)}  # born in between: counts from 0
    step = host_meter.delta_by_name(before, after)
    assert step == {"python3": pytest.approx((2.0, 0.5, 0)), "pt_autograd_0": pytest.approx((42.0, 0.0, 1605))}
    summary = host_meter.summarize([step, dict(step, python3=(0.2, 0.0, 3)), step], min_ms=1.0)
    assert list(summary) == ["pt_autograd_0", "python3"]
    assert summary["python3"] == {"run_ms": 2.0, "wait_ms": 0.5, "minor_faults": 0}
    assert summary["pt_autograd_0"]["minor_faults"] == 1605
    assert "pt_autograd_0" in host_meter.summarize([{"pt_autograd_0": (42.0, 0.0, 0)}]) and \
        host_meter.summarize([{"idle": (0.1, 0.0, 0)}]) == {}
    me = host_meter.sample()
    if me:  # Linux with schedstat: this thread is there, and it has run
        assert any(run > 0 for _, run, _, _ in me.values())
        before = me[threading.get_native_id()][3]
        touched = bytearray(64 << 20)  # 64 MiB: malloc maps it afresh, and zeroing it faults in every page
        assert host_meter.sample()[threading.get_native_id()][3] - before >= len(touched) // (2 << 20)
    timer = host_meter.GcTimer()
    try:
        gc.collect()
        ms, full = timer.read()
        assert ms > 0 and full == 1
    finally:
        timer.close()
    meter = host_meter.StepHostMeter(threads=True)
    for measured in (False, True, True):  # a warm-up step, then two measured ones
        meter.start(measured)
        sum(i * i for i in range(200_000))  # host work
        if measured:
            gc.collect()
        meter.host_done()
        meter.step_done()
    results = meter.results()
    assert all(len(results[key]) == 2 for key in aggregate.HOST_DIAGNOSTICS), results
    assert min(results["host_cpu_ms"]) > 0 and results["gc_full_collections"] == [1, 1]
    assert (results["host_threads_ms"] is not None) == bool(host_meter.sample())


def test_trace_gaps_names_what_ran_around_each_idle_stretch(tmp_path, capsys):
    import gzip

    import trace_gaps

    def ev(cat, name, ts, dur, stream):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}

    events = [ev("kernel", "gemm", 0, 10, 7), ev("kernel", "ncclDevKernel_AllGather", 5, 20, 20),
              ev("kernel", "gemm", 40, 5, 7),  # 15 us idle after the all-gather
              ev("gpu_memcpy", "Memcpy PtoP (Device -> Device)", 50, 30, 21),  # 5 us idle, then comm
              ev("kernel", "gemm", 81, 1, 7), {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 30, "dur": 9}]
    items = trace_gaps.gpu_items(events)
    assert [i["comm"] for i in items] == [False, True, False, True, False]
    gaps = trace_gaps.idle_gaps(items)
    assert [(g["us"], g["after"]["name"], g["before"]["name"]) for g in gaps] == [
        (15, "ncclDevKernel_AllGather", "gemm"), (5, "gemm", "Memcpy PtoP (Device -> Device)"),
        (1, "Memcpy PtoP (Device -> Device)", "gemm")]
    # an NCCL kernel and a GEMM with the same span keep their own kinds
    same_span = trace_gaps.gpu_items([ev("kernel", "ncclDevKernel_AllGather", 0, 10, 20),
                                      ev("kernel", "gemm", 0, 10, 7)])
    assert [i["comm"] for i in same_span] == [True, False]
    path = tmp_path / "t.rank0.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    trace_gaps.main([str(path), "--top", "2"])
    text = capsys.readouterr().out
    assert "idle 0.02 ms in 3 gaps" in text and "0.015 ms at    0.025" in text
    assert "comm on stream 21: Memcpy PtoP" in text
    # the peer started its second communication item 12 us later (from its first) than we did ours
    peer = [ev("kernel", "ncclDevKernel_AllGather", 100, 20, 20), ev("gpu_memcpy", "Memcpy PtoP (Device -> Device)",
                                                                    157, 30, 21)]
    pairs = trace_gaps.paired_comm(items, trace_gaps.gpu_items(peer))
    assert [(p["index"], p["at_us"], p["lag_us"]) for p in pairs] == [(0, 0, 0), (1, 45, 12)]
    peer_path = tmp_path / "t.rank1.json.gz"
    with gzip.open(peer_path, "wt") as f:
        json.dump({"traceEvents": peer}, f)
    trace_gaps.main([str(path), "--peer", str(peer_path), "--top", "1"])
    text = capsys.readouterr().out
    assert "communication items: 2 here, 2 on the peer" in text and "#1 at    0.045 ms, lag   +0.012" in text


def test_host_ops_rank_by_own_and_by_total_time_per_step():
    from types import SimpleNamespace as Op

    averages = [Op(key="aten::mm", self_cpu_time_total=100.0, cpu_time_total=300.0),
                Op(key="aten::empty", self_cpu_time_total=400.0, cpu_time_total=400.0),
                Op(key="c10d::reduce_scatter_tensor_", self_cpu_time_total=10.0, cpu_time_total=900.0)]
    ranked = comm_profile.ops_by_host_time(averages, steps=2, top=2)
    assert ranked["self_ms_per_step"] == {"aten::empty": 0.2, "aten::mm": 0.05}
    assert list(ranked["total_ms_per_step"]) == ["c10d::reduce_scatter_tensor_", "aten::empty"]


def test_time_budget_stops_launching_and_every_run_is_accounted_for(tmp_path, monkeypatch):
    clock = [0.0]
    launched = []

    def fake_launch(rep, config, mode, args, log_dir, timeout):
        launched.append((rep, mode, timeout))
        clock[0] += 100
        return record(mode, rep, fake_result([100, 100, 100], LOSSES, 1 << 30), config=config.name,
                      wall_s=100.0, log=None)

    monkeypatch.setattr(run, "launch", fake_launch)
    monkeypatch.setattr(run.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(run, "probe", lambda: {"gpu": "NVIDIA H200", "gpus": 2, "torch": "2.11.0", "cuda": "13.0",
                                               "nccl": "2.28.9"})
    monkeypatch.setenv("SYMMPOOL_COMMIT", "0123abc")  # a lent machine's stale .git: the caller names the commit
    out = tmp_path / "r.json"
    rc = run.main(["--configs", "1b-b2s1024", "--modes", "stock,symm", "--reps", "3", "--time-budget", "250",
                   "--out", str(out), "--no-plot", "--log-dir", str(tmp_path)])
    assert rc == 0
    assert len(launched) == 2 and launched[1][2] == 150  # a run's timeout never outlasts the budget
    doc = json.loads(out.read_text())
    assert len(doc["records"]) == 2 and len(doc["not_run"]) == 4
    assert all("time budget" in n["reason"] for n in doc["not_run"])
    ctx = doc["context"]  # the run's provenance (bench/provenance.py)
    assert (ctx["commit"], ctx["commit_source"], ctx["clean_tree"]) == ("0123abc", "SYMMPOOL_COMMIT", True)
    assert (ctx["gpu"], ctx["gpus"], ctx["nccl"]) == ("NVIDIA H200", 2, "2.28.9") and ctx["host"] and ctx["date"]


def test_failed_and_hung_children_are_recorded_with_their_output(tmp_path, monkeypatch):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "worker.py").write_text(
        "import sys, time\n"
        "if '--mode' in sys.argv and sys.argv[sys.argv.index('--mode') + 1] == 'stock':\n"
        "    print('CUDA out of memory (fake)', file=sys.stderr); sys.exit(7)\n"
        "time.sleep(120)\n")
    monkeypatch.setattr(run, "HERE", str(fake))
    args = run.parse_args(["--configs", "tiny-b1s8", "--modes", "stock,symm", "--nproc", "1"])
    cfg = args.configs[0]
    failed = run.launch(0, cfg, "stock", args, str(tmp_path), timeout=60)
    assert failed["status"] == "failed" and failed["returncode"] != 0
    assert "out of memory (fake)" in failed["log_tail"]
    hung = run.launch(0, cfg, "symm", args, str(tmp_path), timeout=5)
    assert hung["status"] == "timeout" and "killed after 5 s" in hung["reason"]


def test_plot_writes_a_png_next_to_the_json(tmp_path):
    pytest.importorskip("matplotlib")
    import plot

    path = tmp_path / "fsdp2_h200x2_2026-11-23.json"
    run.write_json(str(path), run.document({"gpu": "h200", "ranks": 2}, RECORDS, []))
    png = plot.plot(str(path))
    assert png == str(tmp_path / "fsdp2_h200x2_2026-11-23.png") and os.path.getsize(png) > 1000


def test_two_process_stock_run_of_the_tiny_model_on_cpu(tmp_path):
    """FSDP2 over gloo: the whole path (meta init, fully_shard, to_empty,
    deterministic init, AdamW, torchrun, the JSON) without a GPU."""
    out = tmp_path / "cpu.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run.py"), "--device", "cpu", "--nproc", "2", "--configs", "tiny-b2s32",
         "--modes", "stock", "--reps", "2", "--steps", "3", "--warmup", "1", "--out", str(out),
         "--log-dir", str(tmp_path / "logs"), "--loss-rtol", "0", "--no-plot", "--memory-trace", "1",
         "--host-threads"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["context"]["ranks"] == 2 and doc["context"]["device"] == "cpu"
    assert "GLIBC_TUNABLES" in doc["context"]["env"]  # the malloc every run had is on record
    [config] = doc["configs"]
    [stock] = config["runs"]
    assert REQUIRED_RUN_KEYS <= stock.keys() and stock["reps"] == 2 and stock["failures"] == []
    assert stock["max_rel_loss_diff_vs_stock"] == 0.0  # same seed and data: CPU runs are bit-equal
    # --memory-trace 1: every all-gather and reduce-scatter of the first step, sampled around
    trace = doc["records"][0]["result"]["ranks"][0]["memory_trace"]
    assert trace["error"] is None and trace["steps"] == 1
    calls = [e["call"] for e in trace["events"]]
    assert {e["step"] for e in trace["events"]} == {0}
    # tiny: 2 blocks and the root, each gathered in forward and backward (the root kept), reduced once
    assert calls.count("foreach_reduce") == 3 and calls.count("foreach_all_gather") >= 3, calls
    assert trace["events"][0]["before"].keys() >= {"device_used", "torch_reserved", "symmpool_reserved"}
    losses = doc["records"][0]["result"]["ranks"][0]["losses"]
    assert len(losses) == 1 + 3 + 3 and 5 < losses[0] < 9  # about ln(1024) = 6.9 at the start
    phases = doc["records"][0]["result"]["ranks"][0]["phases_s"]
    assert list(phases) == ["start_s", "init_s", "build_s", "steps_s", "profile_s"]
    assert all(v >= 0 for v in phases.values()) and phases["start_s"] > 0  # torch's import at least
    assert config["model"]["params"] == configs.param_count(configs.PRESETS["tiny"])
    rank0 = doc["records"][0]["result"]["ranks"][0]
    assert len(rank0["gc_ms"]) == len(rank0["host_cpu_ms"]) == 3 and stock["gc_ms_median"] is not None
    if host_meter.sample():  # Linux with schedstat: the main thread ran (its name: python's)
        assert rank0["host_threads_ms"], rank0["host_threads_ms"]


def test_compiled_blocks_train_the_same_model_as_eager_ones(tmp_path):
    """--compile wraps each block before fully_shard: the same weights (a
    wrapped parameter's name seeds as the plain one), the same losses, and
    dynamo did compile (aot_eager on CPU: no C++ toolchain needed)."""
    losses = {}
    for label, extra in (("eager", []), ("compiled", ["--compile", "aot_eager"])):
        out = tmp_path / f"{label}.json"
        proc = subprocess.run(
            [sys.executable, str(BENCH / "run.py"), "--device", "cpu", "--nproc", "2", "--configs", "tiny-b2s32",
             "--modes", "stock", "--reps", "1", "--steps", "2", "--warmup", "1", "--profile-steps", "0",
             "--out", str(out), "--log-dir", str(tmp_path / label), "--no-plot"] + extra,
            capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = json.loads(out.read_text())
        rank0 = doc["records"][0]["result"]["ranks"][0]
        losses[label] = rank0["losses"]
        if extra:
            assert doc["context"]["compile"] == "aot_eager" and rank0["compiled_graphs"] >= 1, rank0
        else:
            assert doc["context"]["compile"] is None and rank0["compiled_graphs"] is None
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=1e-5), losses


def test_a_failed_profiler_is_reported_and_keeps_the_measured_steps():
    result = fake_result([100, 100, 100], LOSSES, 1 << 30)
    for r in result["ranks"]:
        r["profile"] = {"error": "RuntimeError: CUPTI unavailable"}
    [config] = aggregate.aggregate([record("stock", 0, result)])
    [stock] = config["runs"]
    assert stock["step_ms_median"] == 101 and stock["exposed_comm_ms_median"] is None
    assert stock["profile_errors"] == ["RuntimeError: CUPTI unavailable"]
    assert "CUPTI" in aggregate.profile_error_lines([config])[0]


def test_a_trace_without_gpu_kernels_is_an_error_not_zero():
    with pytest.raises(RuntimeError, match="no GPU kernel"):
        comm_profile.summarize([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}], steps=1)
