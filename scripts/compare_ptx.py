"""Whether kernels that only moved between files compile to the same code:
compares each kernel's PTX (nvcc -ptx, the same flags for every file),
ignoring what a move renames (the anonymous namespace's file-derived name,
branch label numbers).

    nvcc <flags> -ptx old.cu -o /tmp/before.ptx
    nvcc <flags> -ptx new_a.cu -o /tmp/a.ptx; nvcc <flags> -ptx new_b.cu -o /tmp/b.ptx
    python scripts/compare_ptx.py /tmp/before.ptx /tmp/a.ptx /tmp/b.ptx

Exits 1 when a kernel is missing, added or compiled differently."""

from __future__ import annotations

import re
import sys

ANONYMOUS = re.compile(r"\d+_GLOBAL__N__[0-9a-f]{8}_\d+_\w+?_cu_[0-9a-f]{8}")
LABEL = re.compile(r"\$L__BB\d+_")


def kernels(paths: list[str]) -> dict[str, str]:
    """Each kernel's PTX body by its normalised name."""
    out = {}
    for path in paths:
        with open(path) as f:
            text = f.read()
        for m in re.finditer(r"^(?:\.visible )?\.entry (\S+)\(", text, re.M):
            body = text[m.start():text.index("\n}\n", m.start()) + 3]
            out[ANONYMOUS.sub("ANON", m.group(1))] = LABEL.sub("L_", ANONYMOUS.sub("ANON", body))
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    before, after = kernels(argv[:1]), kernels(argv[1:])
    missing, added = sorted(set(before) - set(after)), sorted(set(after) - set(before))
    differ = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    print(f"{len(before)} kernels before, {len(after)} after; {len(set(before) & set(after)) - len(differ)} "
          f"identical")
    for what, names in (("missing", missing), ("added", added), ("compiled differently", differ)):
        for name in names:
            print(f"{what}: {name}")
    return 1 if missing or added or differ else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
