#!/bin/bash
# The cost of the chosen recipe at full length: 10 epochs (make train's) with optim.clip_grad_norm=2 against
# the defaults of c8a5524 (no clipping), seeds 0-3, fp32 and bf16, interleaved seed by seed, from a checkout
# of c8a5524. Usage (from the repository root, as root): [VENV=...] bash docs/results/2026-11-29_zen4-2c_lenet-recipe-grid/run3.sh
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
for s in 0 1 2 3; do for a in off bf16; do
  run 10 $s $a clip2 optim.clip_grad_norm=2
  run 10 $s $a defaults
done; done | tee -a $R/whole.txt
