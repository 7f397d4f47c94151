set -u
source scripts/env.sh
export SYMMPOOL_COMMIT=9e43ec126f450516d8b9c7bf4f57e10ca359bc45
python3 -c "import symmpool" 2>/dev/null || python3 -m pip install -q --no-build-isolation --no-deps . > $OUT/pip.log 2>&1
mkdir -p /tmp/w
for rep in 1 2; do for mode in torch torch-expandable symmpool; do
  if [ $mode = torch-expandable ]; then export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; else unset PYTORCH_CUDA_ALLOC_CONF; fi
  timeout 120 python3 bench/allocator_workload.py --mode $mode --out /tmp/w/${mode}_$rep.json 2>&1 | tail -3
done; done
unset PYTORCH_CUDA_ALLOC_CONF
tar czf $OUT/w.tgz -C /tmp w
