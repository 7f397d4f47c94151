set -u
source scripts/env.sh
export SYMMPOOL_COMMIT=afe1581c2404f6be6e2256233e0696f00d2d2ab6
date; python3 -m pip install -q --no-build-isolation --no-deps . > $OUT/pip.log 2>&1 || { tail -40 $OUT/pip.log; exit 1; }
cd tests/python
timeout 300 python3 -m pytest -q test_process_allocator.py -k memory_api > $OUT/pytest.log 2>&1; echo pytest rc=$?; tail -40 $OUT/pytest.log
for c in memory_api; do echo "== $c"; timeout 120 python3 process_allocator_checks.py $c 2>&1 | tail -8; done
date
