#!/bin/bash
# One round of the LeNet variants, each run under the shared CPU lock on its own so
# other jobs can use the machine between runs. Usage: run_round.sh ROUND
# Run from a checkout of the measured commit (record.json: git_commit); writes
# raw/r<ROUND>_<variant>.summary.json and the epoch rates from TensorBoard.
set -euo pipefail
round=$1
mkdir -p /tmp/lenet_variants
here=$(cd "$(dirname "$0")" && pwd)
venv=${VENV:-/work/main/.venv}
declare -A args=(
  [lenet_eager]="model=lenet trainer.compile=false"
  [fast_eager]="model=lenet_fast trainer.compile=false"
  [lenet_compiled]="model=lenet trainer.compile=true"
  [fast_compiled]="model=lenet_fast trainer.compile=true"
  [fastcrop_compiled]="model=lenet_fast model.pad_channels_to=0 trainer.compile=true"
)
# odd rounds A then B, even rounds B then A, so drift over a round favours neither
if (( round % 2 )); then
  order="lenet_eager fast_eager lenet_compiled fast_compiled fastcrop_compiled"
else
  order="fast_eager lenet_eager fastcrop_compiled fast_compiled lenet_compiled"
fi
for v in $order; do
  dir=/tmp/lenet_variants/r${round}_$v
  rm -rf "$dir"
  cmd="$venv/bin/torchrun --standalone --nproc_per_node=2 -m ddp_lab.train ${args[$v]} trainer.epochs=2 trainer.progress=false hydra.run.dir=$dir"
  echo "$(date -u +%FT%TZ) r$round $v: $cmd" | tee -a "$here/commands.log"
  flock /tmp/ddp_lab_cpu.lock $cmd > "$dir.out" 2>&1
  cp "$dir/summary.json" "$here/raw/r${round}_$v.summary.json"
  "$venv/bin/python" "$here/epoch_rates.py" "$dir/tb" > "$here/raw/r${round}_$v.epochs.json"
done
