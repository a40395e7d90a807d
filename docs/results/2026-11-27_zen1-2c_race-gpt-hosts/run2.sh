#!/bin/bash
# The same GPT race at 2 ranks: on loopback (steps to the target, for the predictions), then across
# 2 emulated hosts at 100 Mbit/s and at 1 Gbit/s.
set -euo pipefail
R=docs/results/2026-11-27_zen1-2c_race-gpt-hosts
FITS=docs/results/2026-11-26_zen4-2c_cluster-lenet-predictions
B="python -m ddp_lab.bench.time_to_accuracy --target-loss 2.8 --epochs 1 --max-steps 200 --eval-every 40"
S="--strategies ddp,powersgd:sync.powersgd_start_step=20,diloco"
G="model=gpt data=text optim=adamw"
$B $S --ranks 2 --out $R/loopback-2 -- $G
for RATE in 100mbit 1gbit; do
  $B $S --hosts 2 --rate $RATE --fit $FITS/costmodel-$RATE-all-sizes/fit.csv --steps-from $R/loopback-2/race.csv \
    --out $R/2h-$RATE -- $G
done
find $R -name model.pt -delete   # the weights are not the record
