#!/usr/bin/env bash
# Fails when a tracked C++/CUDA file differs from clang-format's layout
# (.clang-format). The formatter is pinned (clang-format 18.1.8 from PyPI) so
# every machine agrees. scripts/check_format.sh [--fix] [python]: --fix
# rewrites the files instead; python defaults to the one setup.sh prints.
set -euo pipefail
cd "$(dirname "$0")/.."
fix=0
if [ "${1:-}" = --fix ]; then fix=1; shift; fi
py=${1:-$(bash scripts/setup.sh)}
"$py" -m pip install -q "clang-format==18.1.8" >&2
cf=$("$py" -c 'import clang_format, os; print(os.path.join(os.path.dirname(clang_format.__file__), "data", "bin", "clang-format"))')
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cu')
if [ "$fix" = 1 ]; then
  "$cf" -i "${files[@]}"
else
  "$cf" --dry-run --Werror "${files[@]}"
  echo "check_format: ${#files[@]} files follow .clang-format"
fi
