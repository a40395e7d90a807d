#!/bin/bash
# The grid's overlap mix above 0.8 (run.sh's setup): overlap 4 with sync.overlap_mix 0.9 and 0.95, seeds
# 1, 2, 3 interleaved, into race-mix/. summarize.py compares them with run.sh's runs of the same seed.
# Usage (from the repository root): [VENV=path/to/venv] bash docs/results/2026-11-28_xeon-2c_diloco-defaults-grid/run-mix.sh
set -euo pipefail
R=docs/results/2026-11-28_xeon-2c_diloco-defaults-grid
py=${VENV:-.venv}/bin/python
S="diloco:sync.overlap=4:sync.overlap_mix=0.9,diloco:sync.overlap=4:sync.overlap_mix=0.95"
"$py" -m ddp_lab.bench.time_to_accuracy --ranks 2 --target-loss 2.8 --epochs 1 --max-steps 240 --eval-every 48 \
  --seeds 1,2,3 --strategies "$S" --out $R/race-mix -- model=gpt data=text optim=adamw
find $R -name model.pt -delete   # the weights are not the record
