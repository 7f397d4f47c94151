"""Every results file the README, the docs and the benchmarks' pages cite is in bench/results (a
speed claim must point at a file that is there). Names with placeholders
(`<date>`) are patterns, not citations; a glob must match a file. Needs no GPU."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
CITATION = re.compile(r"bench/results/[A-Za-z0-9_.*<>-]+\.(?:json|png)")
# The shorter forms: a file's bare name (GPU, ranks and date in it), and a
# name cut short after "..." (the rest of a name cited nearby), which must
# end some file's name.
BARE = re.compile(r"(?<![\w/.-])([A-Za-z0-9_.*-]*_[a-z0-9]+x[0-9]+_[0-9]{4}-[0-9]{2}-[0-9]{2}[A-Za-z0-9_.*-]*\.(?:json|png))")
CUT = re.compile(r"\.\.\.[_-]?([A-Za-z0-9_.-]+\.(?:json|png))")


def cited(text: str) -> set[str]:
    names = {m for m in CITATION.findall(text) if "<" not in m}
    names |= {"bench/results/" + m for m in BARE.findall(text) if "<" not in m}
    names |= {"bench/results/*" + m for m in CUT.findall(text)}
    return names


def missing(root: pathlib.Path, names: set[str]) -> list[str]:
    return sorted(n for n in names if not any(root.glob(n)))


def test_every_cited_results_file_exists():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "bench").glob("*/README.md"))]
    names = set().union(*(cited(d.read_text()) for d in docs))
    assert len(names) > 10, names  # the pattern still finds the citations
    assert missing(ROOT, names) == []


def test_a_missing_file_and_an_unmatched_glob_are_found(tmp_path):
    (tmp_path / "bench/results").mkdir(parents=True)
    (tmp_path / "bench/results/a_2026.json").write_text("{}")
    text = ("see `bench/results/a_2026.json`, bench/results/b.json, bench/results/a_*.json, "
            "bench/results/c_*.png and bench/results/x_<date>.json.")
    names = cited(text)
    assert names == {"bench/results/a_2026.json", "bench/results/b.json", "bench/results/a_*.json",
                     "bench/results/c_*.png"}
    assert missing(tmp_path, names) == ["bench/results/b.json", "bench/results/c_*.png"]


def test_short_forms_are_citations_too():
    text = ("(`peers_h200x2_2026-11-27_x.json`, its `.png`, then `..._y-second-run.json` and "
            "`...-z.png`; not `bench/results/w_h200x2_2026-11-27.json` twice, nor `notes.json`)")
    assert cited(text) == {"bench/results/peers_h200x2_2026-11-27_x.json", "bench/results/*y-second-run.json",
                           "bench/results/*z.png", "bench/results/w_h200x2_2026-11-27.json"}
