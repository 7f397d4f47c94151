"""The peer tables of the README and bench/peers/README.md are what
bench/peers/readme_table.py prints for the file each cites beside them (so
the tables are regenerated, not retyped).
Needs no GPU."""
import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("readme_table", ROOT / "bench/peers/readme_table.py")
readme_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_table)

CITED = "peers_h200x2_2026-11-27_own-slice-after-first-meeting-every-peer.json"


def test_the_tables_are_the_cited_file():
    readme = (ROOT / "README.md").read_text()
    bench_page = (ROOT / "bench/peers/README.md").read_text()
    results = json.loads((ROOT / "bench/results" / CITED).read_text())["results"]
    eager = readme_table.table(results, [64 << 20, 256 << 20, 1 << 30])
    graph = readme_table.table(results, [1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20], "graph")
    for page, tables in ((readme, [eager]), (bench_page, [eager, graph])):
        assert f"`bench/results/{CITED}`" in page
        for table in tables:
            assert table in page, table


def test_a_cell_lists_the_fastest_torch_op_and_skips_what_did_not_run():
    def row(peer, variant, op, us, mode="eager", nbytes=1 << 20):
        return {"peer": peer, "variant": variant, "op": op, "bytes": nbytes, "mode": mode, "time_us_median": us}
    results = [row("symmpool", None, "all_gather", 10.0), row("symmpool", "in-place", "all_gather", 1.0),
               row("nccl-registered", None, "all_gather", 20.0), row("torch-symm-mem", "a", "all_gather", 40.0),
               row("torch-symm-mem", "b", "all_gather", 30.0), row("peer-copy", None, "peer_copy", 8.0),
               row("peer-copy", "sm", "peer_copy", 7.0), row("symmpool", None, "all_reduce", None)]
    assert readme_table.cell_time(results, "all_gather", 1 << 20, "eager") == [10.0, 20.0, 30.0, 8.0]
    assert readme_table.cell_time(results, "all_reduce", 1 << 20, "eager") == [None, None, None]
    assert readme_table.table(results, [1 << 20]).splitlines()[2] == "| all-gather | 10.0 / 20.0 / 30.0 / 8.0 |"


def test_files_with_nccl_window_get_its_column_after_nccl_registered():
    def row(peer, op, us, variant=None):
        return {"peer": peer, "variant": variant, "op": op, "bytes": 1 << 20, "mode": "eager", "time_us_median": us}
    results = [row("symmpool", "all_reduce", 10.0), row("nccl-registered", "all_reduce", 20.0),
               row("nccl-window", "all_reduce", 15.0), row("nccl-window", "all_reduce", 1.0, "in-place"),
               row("torch-symm-mem", "all_reduce", 30.0, "a")]
    assert readme_table.cell_time(results, "all_reduce", 1 << 20, "eager") == [10.0, 20.0, 15.0, 30.0]
    assert readme_table.cell_time(results, "all_gather", 1 << 20, "eager") == [None, None, None, None, None]
