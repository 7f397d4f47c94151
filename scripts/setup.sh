#!/usr/bin/env bash
# Installs what symmpool needs on a fresh machine and prints the Python to use.
# - C++: cmake, ninja, GoogleTest, Google Benchmark (Debian/Ubuntu packages).
# - Python: a python3 that imports torch 2.11 is used as is (the GPU hosts, which
#   have matplotlib too: nothing to fetch there);
#   otherwise .venv gets torch 2.11.0 (CUDA 13) from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v cmake >/dev/null || need_pkgs+=(cmake)
command -v ninja >/dev/null || need_pkgs+=(ninja-build)
[ -f /usr/include/gtest/gtest.h ] || need_pkgs+=(libgtest-dev)
[ -f /usr/include/benchmark/benchmark.h ] || need_pkgs+=(libbenchmark-dev)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "setup: installing ${need_pkgs[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >&2
fi

torch_ok() { "$1" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.11") else 1)' 2>/dev/null; }
if torch_ok python3; then
  py=$(command -v python3)
else
  if [ ! -x .venv/bin/python ] || ! torch_ok .venv/bin/python; then
    echo "setup: creating .venv with torch 2.11.0 (a few minutes the first time)" >&2
    python3 -m venv .venv >&2
    .venv/bin/python -m pip install -q --upgrade pip >&2
    .venv/bin/python -m pip install -q "torch==2.11.0" >&2
  fi
  py=$(pwd)/.venv/bin/python
fi
"$py" -m pip install -q "scikit-build-core>=0.10" pytest numpy matplotlib >&2  # matplotlib: bench/fsdp2/plot.py
echo "$py"
