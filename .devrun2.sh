set -u
source scripts/env.sh
export SYMMPOOL_COMMIT=7a053ea2caef1ac422dc171c6471849755b1b1f2
python3 -c "import symmpool" || python3 -m pip install -q --no-build-isolation --no-deps . > $OUT/pip.log 2>&1
date
for rep in 1 2; do for mode in one-step pipelined; do for tokens in 256 2048; do
  if [ $mode = pipelined ]; then b=0; else b=1073741824; fi
  SYMMPOOL_TP_ONE_SHOT_BYTES=$b timeout 100 torchrun --standalone --nproc-per-node=2 bench/host_time.py --share-gpu --cases 'fused_.*op$|matmul whole' --reps 15 --tokens $tokens --out $OUT/ht_${mode}_${tokens}_${rep}.json > $OUT/ht_${mode}_${tokens}_${rep}.log 2>&1; echo $mode $tokens $rep rc=$?
done; done; done
date
for tokens in 256 2048; do
SYMMPOOL_TP_ONE_SHOT_BYTES=1073741824 SYMMPOOL_DEBUG=TRACE SYMMPOOL_DEBUG_SUBSYS=TP timeout 60 torchrun --standalone --nproc-per-node=2 bench/host_time.py --share-gpu --only 'fused_all_gather_matmul op' --seconds 3 --tokens $tokens > $OUT/trace_ag_$tokens.log 2>&1; echo trace $tokens rc=$?
SYMMPOOL_TP_ONE_SHOT_BYTES=1073741824 SYMMPOOL_DEBUG=TRACE SYMMPOOL_DEBUG_SUBSYS=TP timeout 60 torchrun --standalone --nproc-per-node=2 bench/host_time.py --share-gpu --only 'fused_matmul_reduce_scatter op' --seconds 3 --tokens $tokens > $OUT/trace_rs_$tokens.log 2>&1; echo trace rs $tokens rc=$?
done
date
