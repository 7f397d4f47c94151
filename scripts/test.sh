#!/usr/bin/env bash
# The test command: checks the C++ layout (scripts/check_format.sh), builds
# everything (library, torch extension, tests, benches), runs the GoogleTest
# suites through ctest and the pytest suite,
# then the unit tests again under ASan/UBSan and under TSan (scripts/sanitize.sh).
# GPU tests skip with a message where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
py=$(bash scripts/setup.sh)
jobs=$(nproc)

bash scripts/check_format.sh "$py"

cmake -S . -B build -G Ninja -DSYMMPOOL_BUILD_TORCH=ON -DPython3_EXECUTABLE="$py"
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure --timeout 900

"$py" -m pip install -q --no-build-isolation --no-deps .
"$py" -m pytest -v tests/python

bash scripts/sanitize.sh address
bash scripts/sanitize.sh thread
