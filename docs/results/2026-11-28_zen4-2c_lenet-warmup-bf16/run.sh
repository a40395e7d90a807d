#!/bin/bash
# LeNet at the defaults (make train: lenet_fast, 2 ranks, global batch 512, SGD lr 0.2 with Nesterov 0.9,
# cosine over 10 epochs) in bf16 and fp32, with the warm-up of then (optim.warmup_epochs=0.5) and with 1
# epoch, and gradient clipping (optim.clip_grad_norm=5) as the other remedy tried. Runs given a time limit
# are stopped by SIGTERM (ddp_lab saves nothing with trainer.keep_ckpts=0); a diverged run is stopped by
# the divergence guard. These are the commands that ran, in this order (3 scripts then, one here).
# Usage (from the repository root, as root): [VENV=path/to/venv] bash docs/results/2026-11-28_zen4-2c_lenet-warmup-bf16/run.sh
R=docs/results/2026-11-28_zen4-2c_lenet-warmup-bf16
py=${VENV:-.venv}; out=$(mktemp -d /tmp/warmup.XXXX)
run() {  # seconds seed amp label overrides...
  t=$1 seed=$2 amp=$3 label=$4; shift 4
  timeout -s TERM $t $py/bin/torchrun --standalone --nproc_per_node=2 -m ddp_lab.train seed=$seed trainer.amp=$amp \
    trainer.keep_ckpts=0 hydra.run.dir=$out/s$seed-$amp-$label "$@" > $out/s$seed-$amp-$label.log 2>&1
  echo "seed $seed amp $amp $label rc $? $(grep -a -o 'training diverged[^;]*' $out/s$seed-$amp-$label.log | head -1)"
  cp $out/s$seed-$amp-$label/summary.json $R/summaries/s$seed-$amp-$label.summary.json 2>/dev/null
}
mkdir -p $R/summaries
# 1. the defaults of then, 75 s each (past the warm-up's end at step 58; about 650-1,150 steps)
for s in 0 1 2 3 4 5; do for a in bf16 off; do run 75 $s $a default optim.warmup_epochs=0.5; done; done
# 2. the two remedies on the seed that diverged (seed 2 in bf16, at step 63). (Run under the label warm1,
# this one's folder then refused step 4's seed 2: stopped-runs.txt has what it reached.)
run 75 2 bf16 warm1-first optim.warmup_epochs=1
run 75 2 bf16 clip5 optim.warmup_epochs=0.5 optim.clip_grad_norm=5
# 3. a race's DiLoCo run that diverged at step 79 (seed 1, bf16, 5 epochs)
for v in "warm1 optim.warmup_epochs=1" "clip5 optim.warmup_epochs=0.5 optim.clip_grad_norm=5" "base optim.warmup_epochs=0.5"; do
  set -- $v; run 45 1 bf16 diloco5-$1 sync=diloco trainer.epochs=5 $2 ${3:-}
done
# 4. whole runs: warm-up 0.5 against 1 in fp32 on seeds 0, 1, 3 interleaved; then 1 in bf16 on seeds 0-5
for s in 0 1 3; do run 150 $s off warm05 optim.warmup_epochs=0.5; run 150 $s off warm1 optim.warmup_epochs=1; done
for s in 0 1 2 3 4 5; do run 120 $s bf16 warm1 optim.warmup_epochs=1; done
