"""The algorithm table's entries follow from the benchmark files they cite:
scripts/table_from_bench.py, run on those files, prints the entries the
header holds. Needs no GPU."""
import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADER = (ROOT / "collectives/include/symmpool/algorithm_table.hpp").read_text()
spec = importlib.util.spec_from_file_location("table_from_bench", ROOT / "scripts/table_from_bench.py")
table_from_bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(table_from_bench)


def entry_line(result_file):
    data = json.loads((ROOT / "bench/results" / result_file).read_text())
    world, limits = table_from_bench.table_entry(data)
    sizes = ", ".join(table_from_bench.cpp_size(limits[op]) for op in table_from_bench.OPS)
    return f"{{{world}, {sizes}}}"


def test_each_measured_world_size_matches_its_benchmark_file():
    for result_file, expected in [
        ("peers_h200x2_2026-11-27_fused-reductions-every-size.json", "{2, kAnySize, kAnySize, kAnySize}"),
        ("collectives_h200x4_2026-11-22_first-run.json", "{4, kAnySize, kAnySize, 16 * kMiB}"),
    ]:
        assert result_file in HEADER, f"the header no longer cites {result_file}"
        assert entry_line(result_file) == expected
        assert expected in HEADER, f"the header's entry differs from {result_file}: expected {expected}"


def test_a_loss_at_one_size_caps_the_limit_below_it():
    def bench(name, us):
        return {"name": name + "/iterations:10/manual_time", "run_type": "iteration",
                "real_time": us, "time_unit": "us"}
    times = table_from_bench.parse_times([
        bench("AllReduce/symmpool/64KiB", 5.0), bench("AllReduce/nccl/64KiB", 9.0),
        bench("AllReduce/symmpool/1MiB", 10.0), bench("AllReduce/nccl/1MiB", 9.95),  # within 1%
        bench("AllReduceGraph/symmpool/4MiB", 30.0), bench("AllReduceGraph/nccl/4MiB", 20.0),
        bench("AllReduce/symmpool/16MiB", 50.0), bench("AllReduce/nccl/16MiB", 60.0),
    ])
    assert table_from_bench.limit_for(times, "AllReduce", 0.01) == 1 << 20
    assert table_from_bench.limit_for(times, "AllReduce", 1.0) is None  # any size


def test_a_peer_file_compares_symmpool_with_nccl_on_registered_buffers():
    def row(peer, variant, op, size, mode, us):
        return {"peer": peer, "variant": variant, "op": op, "bytes": size, "mode": mode, "time_us_median": us}
    data = {"context": {"ranks": 2}, "results": [
        row("symmpool", None, "all_reduce", 1 << 10, "graph", 5.0),
        row("nccl-registered", None, "all_reduce", 1 << 10, "graph", 9.0),
        row("nccl", None, "all_reduce", 1 << 20, "eager", 1.0),  # plain NCCL: not the table's peer
        row("symmpool", None, "all_reduce", 1 << 20, "eager", 30.0),
        row("nccl-registered", None, "all_reduce", 1 << 20, "eager", 20.0),
        row("symmpool", "two-step 32M", "all_reduce", 1 << 20, "eager", 25.0),
        row("symmpool", "in-place", "all_gather", 1 << 10, "eager", 1.0),  # another call shape: skipped
        row("peer-copy", None, "peer_copy", 1 << 10, "eager", 1.0),
        row("symmpool", None, "all_gather", 1 << 10, "eager", None),  # not run
    ]}
    times = table_from_bench.file_times(data)
    assert times == {("AllReduce", True, "symmpool", 1 << 10): 5.0, ("AllReduce", True, "nccl", 1 << 10): 9.0,
                     ("AllReduce", False, "symmpool", 1 << 20): 30.0, ("AllReduce", False, "nccl", 1 << 20): 20.0,
                     ("AllReduce", False, "symmpool-2step-32m", 1 << 20): 25.0}
    assert table_from_bench.limit_for(times, "AllReduce", 0.01) == 1 << 10


def test_a_repeated_benchmark_counts_by_its_median():
    def run(us, aggregate=None):
        b = {"name": "AllReduce/symmpool/1MiB/iterations:10/manual_time", "real_time": us, "time_unit": "us",
             "run_name": "AllReduce/symmpool/1MiB/iterations:10/manual_time", "run_type": "iteration"}
        if aggregate:
            b.update(run_type="aggregate", aggregate_name=aggregate, name=b["name"] + "_" + aggregate)
        return b
    times = table_from_bench.parse_times([run(30.0), run(10.0), run(11.0), run(17.0, "mean"),
                                          run(11.0, "median"), run(9.5, "stddev")])
    assert times == {("AllReduce", False, "symmpool", 1 << 20): 11.0}


def test_the_fused_reduction_limit_at_two_ranks_follows_its_benchmark_file():
    """fused_kernel_limit(2) is any size: at every size measured over the
    former 16 MiB a peer, one meeting kernel (128 blocks for the all-reduce's
    two-shot, 64 for the reduce-scatter's one-shot: kTwoShotFusedBlocks and
    kOneShotFusedBlocks) beat the kernel between barrier kernels in every
    round, eager: its slowest round under the bracketed build's fastest."""
    result_file = "peers_h200x2_2026-11-27_fused-large-reductions-64-vs-128-blocks.json"
    assert result_file in HEADER
    runs = json.loads((ROOT / "bench/results" / result_file).read_text())["runs"]

    def eager(tag):
        return {(r["op"], r["bytes"]): r["time_us_median"] for r in runs[tag]["results"]
                if r["peer"] == "symmpool" and not r["variant"] and r["mode"] == "eager"}

    rounds = sorted({tag.rsplit("-", 1)[1] for tag in runs})
    assert len(rounds) >= 2
    fused_build = {"all_reduce": "sync128", "reduce_scatter": "fused64"}
    world, old_limit = 2, 16 << 20
    bracketed = [eager(f"head-{r}") for r in rounds]
    beyond = sorted(b for op, b in bracketed[0] if op == "all_reduce" and b // world > old_limit)
    assert beyond and max(beyond) // world >= 128 << 20
    for op, build in fused_build.items():
        fused = [eager(f"{build}-{r}") for r in rounds]
        for b in beyond:
            slowest_fused = max(f[(op, b)] for f in fused)
            fastest_bracketed = min(h[(op, b)] for h in bracketed)
            assert slowest_fused < fastest_bracketed, (op, b, slowest_fused, fastest_bracketed)
    assert "world == 2 ? kAnySize" in HEADER
    assert "kTwoShotFusedBlocks = 128" in HEADER and "kOneShotFusedBlocks = 64" in HEADER
