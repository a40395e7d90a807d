#!/bin/bash
# The small GPT (model=gpt, 834k parameters: 3.3 MB of fp32 gradients a step, 6.5x LeNet's) on Debian's
# fortunes with AdamW, raced to validation loss 2.8 by DDP, PowerSGD (plain for its first 20 steps of 200)
# and DiLoCo (its defaults), 200 steps each (global batch 64 sequences of 64 bytes), evaluated every 40 steps.
# First on loopback (steps to the target, for the cost model), then across 4 emulated hosts at 100 Mbit/s.
# The link's fit: the 100mbit cost model fit of docs/results/2026-11-26_zen4-2c_cluster-lenet-predictions/.
set -euo pipefail
R=docs/results/2026-11-26_zen1-2c_race-gpt
FITS=docs/results/2026-11-26_zen4-2c_cluster-lenet-predictions
B="python -m ddp_lab.bench.time_to_accuracy --target-loss 2.8 --epochs 1 --max-steps 200 --eval-every 40"
S="--strategies ddp,powersgd:sync.powersgd_start_step=20,diloco"
G="model=gpt data=text optim=adamw"
N=${N:-4}
$B $S --ranks $N --out $R/loopback-$N -- $G
$B $S --hosts $N --rate 100mbit --fit $FITS/costmodel-100mbit-all-sizes/fit.csv --steps-from $R/loopback-$N/race.csv --out $R/${N}h-100mbit -- $G
find $R -name model.pt -delete   # the weights are not the record
