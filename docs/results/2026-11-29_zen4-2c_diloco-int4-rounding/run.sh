#!/bin/bash
# int4 outer gradients' rounding under DiLoCo, 2 ranks on loopback, seeds 1-3 interleaved: the GPT under AdamW
# and LeNet under SGD, each at a fixed budget (trained on past the target, the final figure compared).
# Usage (from the repository root): [VENV=path/to/venv] bash docs/results/2026-11-29_zen4-2c_diloco-int4-rounding/run.sh
set -euo pipefail
py=${VENV:-.venv}/bin/python
R=docs/results/2026-11-29_zen4-2c_diloco-int4-rounding
S="diloco:sync.compress=int4:sync.overlap=2:sync.rounding=nearest,diloco:sync.compress=int4:sync.overlap=2:sync.rounding=feedback,diloco:sync.compress=int4:sync.overlap=2:sync.rounding=stochastic"
[ -f $R/gpt/race.csv ] || $py -m ddp_lab.tools.bench.time_to_accuracy --ranks 2 --strategies "$S" --seeds 1,2,3 \
  --target-loss 2.7 --epochs 1 --max-steps 240 --eval-every 24 --out $R/gpt -- model=gpt data=text optim=adamw
[ -f $R/lenet/race.csv ] || $py -m ddp_lab.tools.bench.time_to_accuracy --ranks 2 --strategies "$S" --seeds 1,2,3 \
  --target-acc 0.85 --epochs 2 --eval-every 24 --out $R/lenet
find $R -name model.pt -delete   # the weights are not the record
