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
        ("collectives_h200x2_2026-11-22_final-defaults.json", "{2, kAnySize, kAnySize, 256 * kMiB}"),
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
    """fused_kernel_limit(2): the largest size a peer where one meeting kernel
    beat the kernel between barriers, in both reductions, by more than the
    same file's spread between the two builds where they run the same kernel
    (sizes under the old 8 MiB limit)."""
    result_file = "peers_h200x2_2026-11-27_sync64-and-fused-every-size.json"
    assert result_file in HEADER
    runs = json.loads((ROOT / "bench/results" / result_file).read_text())

    def eager(tag):
        return {(r["op"], r["bytes"]): r["time_us_median"] for r in runs[tag]["results"]
                if r["peer"] == "symmpool" and not r["variant"] and r["mode"] == "eager"}

    fused, bracketed = eager("sync64fused-1"), eager("sync64-1")
    ops, world, old_limit = ("all_reduce", "reduce_scatter"), 2, 8 << 20
    per_peer = sorted({b // world for _, b in fused})
    spread = max(abs(fused[(op, p * world)] / bracketed[(op, p * world)] - 1)
                 for op in ops for p in per_peer if p <= old_limit)
    limit = old_limit
    for p in (p for p in per_peer if p > old_limit):
        if not all(fused[(op, p * world)] < bracketed[(op, p * world)] * (1 - spread) for op in ops):
            break
        limit = p
    assert limit == 16 << 20, (limit, spread)
    assert "world == 2 ? 16 * kMiB" in HEADER
