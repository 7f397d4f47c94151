#!/usr/bin/env bash
# The main job: FSDP2 training of a Llama-style model of about 1B parameters
# on every local GPU (one is enough), stock NCCL against the README's first
# recipe, "symm-hooks" (a plain "nccl" job plus symmpool.fsdp.enable: FSDP2's
# comm buffers in symmpool memory, symmpool's collectives where its table
# prefers them), each in its own process. Prints one table (step time median
# [p10-p90], host time, exposed communication, device peak memory, loss
# difference) and exits non-zero if a run fails or the losses differ from
# stock's beyond --loss-rtol (2e-2 relative, see below).
#
# Arguments go to bench/fsdp2/run.py after these defaults, so they win:
#   --steps N (measured, 20)  --warmup N (3)  --preset/--model NAME (1b)
#   --batch B (2)  --seq S (1024)  --modes stock,symm-hooks  --json FILE
#   --loss-rtol X  --reps N  (python3 bench/fsdp2/run.py --help: all of them)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
py=$(bash scripts/setup.sh)
"$py" -m pip install -q --no-build-isolation --no-deps .
gpus=$("$py" -c 'import torch; print(torch.cuda.device_count())')
if [ "$gpus" -lt 1 ]; then
  echo "train.sh: no CUDA GPU visible; the main job needs one or more" >&2
  exit 1
fi
# Loss tolerance: stock against stock differs by up to 7e-6 after 8 steps
# and 5e-2 after 41 (torch has no deterministic kernel for some ops, and
# training on random tokens amplifies it); symm against stock was 4.6e-3
# after 23 steps of this model (the "symm" backend's route). Agreement to 1e-5 (twice stock's own
# spread) is the regression test's job (tests/python/test_fsdp2_regression.py).
# The JSON goes to a scratch directory unless --json says where; the
# benchmark's committed results live in bench/results. A tree with local
# changes still trains (--allow-dirty), and its JSON says clean_tree: false.
exec "$py" bench/fsdp2/run.py --preset 1b --batch 2 --seq 1024 --steps 20 --warmup 3 \
  --modes stock,symm-hooks --reps 1 --deterministic --loss-rtol 2e-2 --allow-dirty --out-dir "${TMPDIR:-/tmp}/symmpool_train" "$@"
