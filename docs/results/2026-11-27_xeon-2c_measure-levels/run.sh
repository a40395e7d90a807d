#!/bin/sh
# The step time at each trainer.measure level: LeNet (the default run), 2 CPU ranks,
# 300 steps after 20 of warm-up, the three levels interleaved, 3 repeats.
# Usage (from the repository root): [VENV=path/to/venv] sh docs/results/2026-11-27_xeon-2c_measure-levels/run.sh
set -e
here=$(dirname "$0")
out=$(mktemp -d /tmp/measure-levels.XXXX)
for rep in 1 2 3; do
  for level in full light off; do
    ${VENV:-.venv}/bin/torchrun --standalone --nproc_per_node=2 -m ddp_lab.train \
      trainer.measure=$level trainer.max_steps=300 trainer.warmup_steps=20 trainer.epochs=1 \
      trainer.eval_every=0 trainer.keep_ckpts=0 trainer.progress=false \
      hydra.run.dir=$out/$level-$rep > "$here/$level-$rep.log" 2>&1
    ${VENV:-.venv}/bin/python -c "import json,sys; s=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], s['step_ms'], s['samples_per_sec'])" \
      "$out/$level-$rep/summary.json" $level $rep | tee -a "$here/step_ms.txt"
  done
done
rm -rf "$out"
