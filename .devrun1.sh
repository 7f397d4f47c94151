set -u
source scripts/env.sh
export SYMMPOOL_COMMIT=7a053ea2caef1ac422dc171c6471849755b1b1f2
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
date; python3 -m pip install -q --no-build-isolation --no-deps . > $OUT/pip.log 2>&1 || { tail -40 $OUT/pip.log; exit 1; }
date; cd tests/python
timeout 480 python3 -m pytest -q test_tp_ops.py -k "(sharing and (fused or graphs or late_rank or workspace)) or one_shot" > $OUT/pytest.log 2>&1; echo pytest rc=$?; tail -15 $OUT/pytest.log; date
