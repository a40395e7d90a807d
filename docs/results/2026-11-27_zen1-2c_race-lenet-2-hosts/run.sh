#!/bin/bash
# The LeNet race of docs/results/2026-11-26_zen1-2c_race-lenet/ (the same command: 0.88 test accuracy,
# 5 epochs, evaluated every 24 steps, DDP, PowerSGD, local SGD, DiLoCo) at 2 ranks: on loopback (steps to
# the target, for the cost model), then across 2 emulated hosts at 100 Mbit/s and at 1 Gbit/s.
set -euo pipefail
R=docs/results/2026-11-27_zen1-2c_race-lenet-2-hosts
FITS=docs/results/2026-11-26_zen4-2c_cluster-lenet-predictions
B="python -m ddp_lab.bench.time_to_accuracy --target-acc 0.88 --epochs 5 --eval-every 24"
$B --ranks 2 --out $R/loopback-2
for RATE in 100mbit 1gbit; do
  $B --hosts 2 --rate $RATE --fit $FITS/costmodel-$RATE-all-sizes/fit.csv --steps-from $R/loopback-2/race.csv \
    --out $R/2h-$RATE
done
find $R -name model.pt -delete   # the weights are not the record
