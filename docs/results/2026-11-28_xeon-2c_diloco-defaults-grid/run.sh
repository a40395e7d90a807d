#!/bin/bash
# DiLoCo's defaults from a grid, 3 seeds a point: the small GPT on 2 ranks on loopback, 240 steps,
# validation loss every 48 steps (a multiple of every sync.every in the grid) and after the budget.
# Every point is one --strategies entry, so seed 1 of every point runs, then seed 2, then seed 3.
# Points: the defaults (every 8, outer lr 0.7, Nesterov momentum 0.5); momentum 0 and 0.9; outer lr 0.4
# and 1.0; plain averaging (outer lr 1, momentum 0: local SGD); every 4 and 16; overlap 4 with the
# mix 0.5 (default), 0 and 0.8; DDP for reference.
# Usage (from the repository root): [VENV=path/to/venv] bash docs/results/2026-11-28_xeon-2c_diloco-defaults-grid/run.sh
set -euo pipefail
R=docs/results/2026-11-28_xeon-2c_diloco-defaults-grid
py=${VENV:-.venv}/bin/python
S="ddp,diloco,diloco:sync.outer_momentum=0,diloco:sync.outer_momentum=0.9"
S="$S,diloco:sync.outer_lr=0.4,diloco:sync.outer_lr=1.0,diloco:sync.outer_lr=1.0:sync.outer_momentum=0"
S="$S,diloco:sync.every=4,diloco:sync.every=16"
S="$S,diloco:sync.overlap=4,diloco:sync.overlap=4:sync.overlap_mix=0,diloco:sync.overlap=4:sync.overlap_mix=0.8"
"$py" -m ddp_lab.bench.time_to_accuracy --ranks 2 --target-loss 2.8 --epochs 1 --max-steps 240 --eval-every 48 \
  --seeds 1,2,3 --strategies "$S" --out $R/race -- model=gpt data=text optim=adamw
find $R -name model.pt -delete   # the weights are not the record
