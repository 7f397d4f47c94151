"""docs/configuration.md lists every environment variable the library reads,
and no other. Needs no GPU."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBRARY = ["common", "allocator", "symmetric", "collectives", "bindings"]
READS = re.compile(r'(?:getenv|is_true|is_false|value)\("([A-Z][A-Z0-9_]+)"\)|environ(?:\.get)?[\[(]"([A-Z][A-Z0-9_]+)"')


def read_by_the_code() -> set[str]:
    names = set()
    for folder in LIBRARY:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".cpp", ".hpp", ".cu", ".cuh", ".py"):
                names |= {a or b for a, b in READS.findall(path.read_text())}
    return names


def documented() -> set[str]:
    rows = (ROOT / "docs/configuration.md").read_text().splitlines()
    return {m.group(1) for row in rows if (m := re.match(r"\| `([A-Z][A-Z0-9_]+)` \|", row))}


def test_every_variable_the_code_reads_is_documented_and_no_other():
    code, doc = read_by_the_code(), documented()
    assert code, "the scan found no variable: its pattern is broken"
    assert not code - doc, f"read by the code, missing from docs/configuration.md: {sorted(code - doc)}"
    assert not doc - code, f"in docs/configuration.md, read nowhere: {sorted(doc - code)}"
