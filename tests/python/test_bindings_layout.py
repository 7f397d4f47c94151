"""bindings/torch is split by concern (docs/DESIGN.md, Layers): the c10d
backend includes nothing from the functional ops or tensor parallelism, and
every file of the extension is built. Needs no GPU."""
import pathlib
import re

TORCH = pathlib.Path(__file__).resolve().parents[2] / "bindings" / "torch"
INCLUDE = re.compile(r'^#include "([^"]+)"', re.MULTILINE)


def includes(folder: str) -> dict[str, list[str]]:
    return {path.name: INCLUDE.findall(path.read_text())
            for path in sorted((TORCH / folder).glob("*.[ch]pp"))}


def test_the_c10d_backend_includes_nothing_from_the_layers_on_top_of_it():
    found = includes("c10d")
    assert found, "no file under bindings/torch/c10d: the scan is broken"
    upward = {name: [i for i in incs if i.startswith(("tp/", "ops/", "allocator/"))] for name, incs in found.items()}
    assert not any(upward.values()), f"c10d/ files include from tp/, ops/ or allocator/: {upward}"


def test_every_include_names_an_existing_file_and_every_source_is_built():
    built = set(re.split(r"[\s()]+", (TORCH / "CMakeLists.txt").read_text()))
    for path in TORCH.rglob("*.[ch]pp"):
        for inc in INCLUDE.findall(path.read_text()):
            assert (TORCH / inc).exists(), f"{path.relative_to(TORCH)} includes {inc}, which is not there"
        if path.suffix == ".cpp":
            assert str(path.relative_to(TORCH)) in built, f"{path.relative_to(TORCH)} is not built"
