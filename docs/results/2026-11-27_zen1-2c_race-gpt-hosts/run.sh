#!/bin/bash
# The small GPT race of docs/results/2026-11-26_zen1-2c_race-gpt/ (the same command: validation loss 2.8,
# 200 steps, evaluated every 40, DDP, PowerSGD plain for 20 steps, DiLoCo) across 4 emulated hosts of
# one rank each, every link at 100 Mbit/s, then 1 Gbit/s. Steps to the target for the predictions come
# from that record's loopback race of 4 ranks; the links' fits from the cost model record below.
set -euo pipefail
R=docs/results/2026-11-27_zen1-2c_race-gpt-hosts
LOOP=docs/results/2026-11-26_zen1-2c_race-gpt/loopback-4
FITS=docs/results/2026-11-26_zen4-2c_cluster-lenet-predictions
B="python -m ddp_lab.bench.time_to_accuracy --target-loss 2.8 --epochs 1 --max-steps 200 --eval-every 40"
S="--strategies ddp,powersgd:sync.powersgd_start_step=20,diloco"
G="model=gpt data=text optim=adamw"
for RATE in ${RATES:-100mbit 1gbit}; do
  $B $S --hosts 4 --rate $RATE --fit $FITS/costmodel-$RATE-all-sizes/fit.csv --steps-from $LOOP/race.csv \
    --out $R/4h-$RATE -- $G
done
find $R -name model.pt -delete   # the weights are not the record
