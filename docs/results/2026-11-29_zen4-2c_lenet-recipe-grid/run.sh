#!/bin/bash
# The shipped LeNet recipe chosen from a grid: make train's defaults (lenet_fast, 2 ranks, global batch 512,
# SGD lr 0.2 with Nesterov 0.9, 1 epoch of warm-up, cosine) against three changes, each on seeds 0-7 in fp32
# and bf16 (this CPU has native bf16), cut to 2 epochs. No recipe of these held the mark on every seed: run2.sh is
# the second round. Both ran from a checkout of c8a5524 (the code before the builder; each recipe is overrides).
# Runs are interleaved seed by seed. A diverged run is stopped by the divergence guard (rc 1).
# Usage (from the repository root, as root): [VENV=path/to/venv] bash docs/results/2026-11-29_zen4-2c_lenet-recipe-grid/run.sh
R=docs/results/2026-11-29_zen4-2c_lenet-recipe-grid
py=${VENV:-.venv}; out=$(mktemp -d /tmp/grid.XXXX)
run() {  # epochs seed amp label overrides...
  e=$1 seed=$2 amp=$3 label=$4; shift 4
  n=e$e-s$seed-$amp-$label
  $py/bin/torchrun --standalone --nproc_per_node=2 -m ddp_lab.train trainer.epochs=$e seed=$seed trainer.amp=$amp \
    trainer.keep_ckpts=0 hydra.run.dir=$out/$n "$@" > $out/$n.log 2>&1
  echo "epochs $e seed $seed amp $amp $label rc $? $(grep -a -o 'training diverged[^;]*' $out/$n.log | head -1)" \
       "$(grep -a -o 'test acc [0-9.]*,' $out/$n.log | tail -1)"
  cp $out/$n/summary.json $R/summaries/$n.summary.json 2>/dev/null
}
mkdir -p $R/summaries
declare -A recipe=(
  [defaults]=""
  [clip5]="optim.clip_grad_norm=5"
  [lr0.1]="optim.lr=0.1"
  [lr0.15-clip5]="optim.lr=0.15 optim.clip_grad_norm=5"
)
# the grid, 2 epochs
for s in 0 1 2 3 4 5 6 7; do for a in off bf16; do for r in defaults clip5 lr0.1 lr0.15-clip5; do
  run 2 $s $a $r ${recipe[$r]}
done; done; done | tee -a $R/cut.txt
