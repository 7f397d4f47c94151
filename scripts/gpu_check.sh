#!/usr/bin/env bash
# On the GPU machine: build, run every test, the main job and the benches in
# one go, logs under $OUT. Stages: env build ctest pytest pytest2 train train-own bench hostcost hosttime hostlayers collbench windows
# fsdp2bench memtrace peers tpops (all but pytest2, hostcost, hosttime, hostlayers, fsdp2bench, memtrace, peers
# and tpops by default), e.g.
# `bash scripts/gpu_check.sh build bench`.
# fsdp2bench runs bench/fsdp2/run.py with $FSDP2_BENCH_ARGS (default: its own defaults, the
# issue's six configs x six modes x 3 reps: far more than 10 minutes; give --configs and
# --time-budget), JSON and PNG into $OUT.
# peers runs bench/peers/run.py on every GPU (symmpool, NCCL, NCCL on registered buffers, NCCL on its
# symmetric windows, torch symm_mem, the bare peer copy) with a 480 s budget and $PEERS_BENCH_ARGS, JSON and
# PNG into $OUT.
# windows runs the NCCL-window GPU test and bench/window_registration.py on every GPU, JSON into $OUT.
# hosttime runs bench/host_time.py on 2 ranks or more (both on GPU 0 where there is one GPU), JSON into $OUT.
# hostlayers runs bench/host_layers.py (one eager all-reduce's host time, layer by layer; 2 ranks on GPU 0).
# tpops runs bench/tp_ops/run.py on every GPU (all-gather + matmul and matmul + reduce-scatter:
# symmpool fused, NCCL unfused, torch fused, matmul alone, transfer alone) with a 480 s budget and
# $TP_OPS_BENCH_ARGS, JSON and PNG into $OUT.
# Every benchmark (the main job too) refuses a dirty tree, and this machine's .git may be stale: set
# SYMMPOOL_COMMIT to the commit of the clean tree these files came from (or SYMMPOOL_BENCH_ALLOW_DIRTY=1
# to measure changes, marked clean_tree: false). docs/results.md, *Provenance of a results file*.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
OUT=${OUT:-/tmp/symmpool-out}
mkdir -p "$OUT"
stages=${*:-env build ctest pytest train train-own bench collbench}
py=python3
jobs=$(nproc)
status=0
run() {  # run <log> <command...>: tees into $OUT/<log>, remembers failures
  local log=$1; shift
  echo "=== $* ===" | tee -a "$OUT/$log"
  "$@" 2>&1 | tee -a "$OUT/$log"
  local rc=${PIPESTATUS[0]}
  echo "=== exit $rc ===" | tee -a "$OUT/$log"
  [ "$rc" -eq 0 ] || status=1
}

for stage in $stages; do
  case $stage in
    env)
      run env.log nvidia-smi
      run env.log nvidia-smi topo -m
      run env.log $py -c 'import torch, sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.cuda.device_count())'
      run env.log bash -c 'cmake --version | head -1; nvcc --version | tail -1; ls /usr/include/nccl.h; python3-config --includes; ls /usr/lib/x86_64-linux-gnu/cmake | grep -iE "gtest|bench"; env | grep -E "NVLS|MULTICAST"' ;;
    build)
      # The device machine keeps build outputs between calls, and copied
      # sources can look older than them: ninja then skips real changes
      # (seen 2026-11-26). Sources whose contents changed since the last
      # build get a fresh mtime first.
      sources="common allocator collectives symmetric bindings tests bench examples cmake CMakeLists.txt"
      # shellcheck disable=SC2086  # the variable holds several paths
      sources_hash=$(find $sources -type f \( -name '*.cpp' -o -name '*.cu' -o -name '*.hpp' -o -name '*.h' -o -name '*.cuh' \
        -o -name 'CMakeLists.txt' -o -name '*.cmake' \) -print0 | sort -z | xargs -0 sha1sum | sha1sum | cut -c1-40)
      if [ -d build ] && [ "$(cat build/.sources_hash 2>/dev/null)" != "$sources_hash" ]; then
        # shellcheck disable=SC2086
        find $sources -type f -exec touch {} +
      fi
      run build.log cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSYMMPOOL_BUILD_TORCH=ON -DPython3_EXECUTABLE=$py
      run build.log cmake --build build -j "$jobs"
      run build.log $py -m pip install --no-build-isolation --no-deps .
      [ "$status" -ne 0 ] || echo "$sources_hash" > build/.sources_hash ;;
    ctest)
      run ctest.log ctest --test-dir build --output-on-failure --timeout 600 ;;
    pytest)
      run pytest.log $py -m pytest -v -s tests/python ;;
    pytest2)  # world size 2 on a larger machine
      run pytest.log env CUDA_VISIBLE_DEVICES=0,1 $py -m pytest -v -s tests/python/test_gpu.py ;;
    train)
      run train.log bash scripts/train.sh --steps 50 --no-plot --json "$OUT/train.json" ;;
    train-own)  # the same, with every collective it can on symmpool's own engines
      run train.log bash scripts/train.sh --steps 50 --no-plot --modes stock,symm-always --json "$OUT/train_own.json" ;;
    bench)
      run bench.log build/bench/symmpool_alloc_bench --benchmark_out="$OUT/alloc_bench.json" \
        --benchmark_out_format=json --benchmark_repetitions=3 --benchmark_report_aggregates_only=true ;;
    hostcost)  # host time per async collective call: nccl, symm with plain tensors, symm tensors
      run hostcost.log $py -m torch.distributed.run --standalone --nproc-per-node="$(nvidia-smi -L | wc -l)" \
        bench/collectives_host_cost.py --out "$OUT/collectives_host_cost.json" ;;
    hosttime)  # host time per call of the eager collectives and fused ops, layer by layer
      gpus=$(nvidia-smi -L | wc -l)
      share=()
      [ "$gpus" -ge 2 ] || share=(--share-gpu)
      run hosttime.log $py -m torch.distributed.run --standalone --nproc-per-node="$(( gpus >= 2 ? gpus : 2 ))" \
        bench/host_time.py "${share[@]}" --out "$OUT/host_time.json" ;;
    hostlayers)  # an eager all-reduce's host time by layer: C++ loops beside the Python calls
      run hostlayers.log $py -m torch.distributed.run --standalone --nproc-per-node=2 bench/host_layers.py \
        --out "$OUT/host_layers.json" ;;
    memtrace)  # where the comm-buffer flag's memory goes (docs/fsdp2_flag_memory.md): about a minute on 2 GPUs
      run memtrace.log $py bench/fsdp2/run.py --configs 1.4b-b2s2048 --modes stock,symm-nccl --reps 1 \
        --warmup 2 --steps 3 --profile-steps 0 --memory-trace 2 --no-plot --out "$OUT/fsdp2_memory_trace.json" ;;
    fsdp2bench)  # e.g. FSDP2_BENCH_ARGS="--configs 3.5b-b2s2048 --time-budget 540"
      # shellcheck disable=SC2086  # the variable holds several arguments
      run fsdp2bench.log $py bench/fsdp2/run.py --out-dir "$OUT" ${FSDP2_BENCH_ARGS:-} ;;
    peers)  # e.g. PEERS_BENCH_ARGS="--sizes 1K:64M --ops all_reduce"
      # shellcheck disable=SC2086  # the variable holds several arguments
      run peers.log $py -m torch.distributed.run --standalone --nproc-per-node="$(nvidia-smi -L | wc -l)" \
        bench/peers/run.py --out "$OUT/peers.json" --time-budget 480 ${PEERS_BENCH_ARGS:-} ;;
    tpops)  # e.g. TP_OPS_BENCH_ARGS="--models 70b --tokens 8192,32768 --gather-dim 1"
      # shellcheck disable=SC2086  # the variable holds several arguments
      run tpops.log $py -m torch.distributed.run --standalone --nproc-per-node="$(nvidia-smi -L | wc -l)" \
        bench/tp_ops/run.py --out "$OUT/tp_ops.json" --time-budget 480 ${TP_OPS_BENCH_ARGS:-} ;;
    windows)  # NCCL's symmetric windows: their test, then the time to register one, by segment size
      run windows.log $py -m pytest -v -s tests/python/test_gpu.py -k nccl_windows
      run windows.log $py -m torch.distributed.run --standalone --nproc-per-node="$(nvidia-smi -L | wc -l)" \
        bench/window_registration.py --out "$OUT/window_registration.json" ;;
    collbench)  # e.g. COLLBENCH_ARGS="--benchmark_filter=AllReduce"
      # shellcheck disable=SC2086  # the variable holds several arguments
      run collbench.log build/bench/symmpool_collectives_bench \
        --benchmark_out="$OUT/collectives_bench.json" --benchmark_out_format=json ${COLLBENCH_ARGS:-}
      run collbench.log $py scripts/table_from_bench.py "$OUT/collectives_bench.json" ;;
  esac
done
exit $status
