#!/usr/bin/env bash
# The main job: FSDP2 training on every local GPU, stock NCCL against "symm"
# with FSDP2's comm buffers in symmpool memory. Extra arguments go to
# examples/fsdp2_train.py (e.g. --steps 100).
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
cd examples  # so that the installed package, not the source tree, is imported
exec "$py" -m torch.distributed.run --standalone --nproc-per-node="$gpus" fsdp2_train.py "$@"
