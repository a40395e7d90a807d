#!/bin/bash
# The grid's second round: run.sh's first round left every recipe short of the mark on some seed (the defaults
# at 0.7999 on seed 5 fp32, clipping at 5 at 0.8279 on seed 6 fp32, lr 0.1 a median of 0.84). LeNet's gradient
# norm at these settings has a median of 0.68, a 90th percentile of 2.7 and spikes to 8.6 (seed 5, fp32, first
# 200 steps): so clip at 2 (under the 90th percentile, 2.7: the spikes, not the typical step), at lr 0.2, on the same
# 16 (seed, dtype) runs, 2 epochs. run3.sh runs it whole against the defaults.
# Usage (from the repository root, as root): [VENV=...] bash docs/results/2026-11-29_zen4-2c_lenet-recipe-grid/run2.sh
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
declare -A recipe=([clip2]="optim.clip_grad_norm=2")
for s in 0 1 2 3 4 5 6 7; do for a in off bf16; do
  run 2 $s $a clip2 ${recipe[clip2]}
done; done | tee -a $R/cut.txt
