set -u
source scripts/env.sh
export SYMMPOOL_COMMIT=847e1b5e5abffdbf53b3f134c82d9b540cc075a5
date; python3 -m pip install -q --no-build-isolation --no-deps . > $OUT/pip.log 2>&1 || { tail -40 $OUT/pip.log; exit 1; }
mkdir -p /tmp/r; cd tests/python
timeout 280 python3 -m pytest -q test_tp_ops.py -k "(sharing and (fused or graphs or late_rank or workspace)) or one_shot" > /tmp/r/pytest.log 2>&1; echo pytest rc=$?; tail -4 /tmp/r/pytest.log; date
cd ../..
for rep in 1 2; do for mode in one-step pipelined; do for tokens in 256 2048; do
  if [ $mode = pipelined ]; then b=0; else b=1073741824; fi
  SYMMPOOL_TP_ONE_SHOT_BYTES=$b timeout 100 torchrun --standalone --nproc-per-node=2 bench/host_time.py --share-gpu --cases 'fused_.*op$|matmul whole' --reps 15 --tokens $tokens --out /tmp/r/ht_${mode}_${tokens}_${rep}.json > /tmp/r/ht_${mode}_${tokens}_${rep}.log 2>&1; echo $mode $tokens $rep rc=$?
done; done; done
date
for tokens in 256 2048; do for op in all_gather_matmul matmul_reduce_scatter; do
SYMMPOOL_TP_ONE_SHOT_BYTES=1073741824 SYMMPOOL_DEBUG=TRACE SYMMPOOL_DEBUG_SUBSYS=TP timeout 60 torchrun --standalone --nproc-per-node=2 bench/host_time.py --share-gpu --only "fused_$op op" --seconds 3 --tokens $tokens > /tmp/r/trace_${op}_$tokens.log 2>&1; echo trace $op $tokens rc=$?
done; done
date; tar czf $OUT/r.tgz -C /tmp r
