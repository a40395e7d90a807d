#!/bin/bash
# LeNet (the defaults: lenet_fast, Fashion-MNIST, global batch 512, SGD lr 0.2) raced to 0.88 test accuracy
# by DDP, PowerSGD, local SGD and DiLoCo (their defaults), 5 epochs each, evaluated every 24 steps.
# First on loopback (steps to the target, for the cost model), then across emulated hosts.
# The links' fits: the 100mbit and 1gbit cost model fits of docs/results/2026-11-26_zen4-2c_cluster-lenet-predictions/.
set -euo pipefail
R=docs/results/2026-11-26_zen1-2c_race-lenet
FITS=docs/results/2026-11-26_zen4-2c_cluster-lenet-predictions
B="python -m ddp_lab.bench.time_to_accuracy --target-acc 0.88 --epochs 5 --eval-every 24"
N=${N:-4}
$B --ranks $N --out $R/loopback-$N
$B --hosts $N --rate 100mbit --fit $FITS/costmodel-100mbit-all-sizes/fit.csv --steps-from $R/loopback-$N/race.csv --out $R/${N}h-100mbit
$B --hosts $N --rate 1gbit --fit $FITS/costmodel-1gbit-all-sizes/fit.csv --steps-from $R/loopback-$N/race.csv --out $R/${N}h-1gbit
find $R -name model.pt -delete   # the weights are not the record
