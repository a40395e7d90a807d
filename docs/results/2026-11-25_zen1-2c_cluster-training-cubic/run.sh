#!/bin/bash
# Training across emulated hosts (ddp_lab.cluster) with the hosts' TCP
# congestion control pinned to cubic (c74a13a): the LeNet runs of
# ../2026-11-25_zen1-2c_cluster-training (removed as superseded by this
# record; git keeps it) again, and ResNet-18 on 1-4 hosts
# (sync.compress none, and bf16 at 100mbit). Step times are predicted from the
# fits of ../2026-11-25_zen1-2c_cluster-costmodel-cubic: LeNet's 516 KB of
# gradients by the fit on every size, ResNet-18's 44.7 MB by the fit on
# messages of 1 MiB and more. As root, from the
# repository root:
#
#   bash docs/results/2026-11-25_zen1-2c_cluster-training-cubic/run.sh
#
# Writes one folder per bench.scaling run (scaling.csv/md/png, record.json and
# every run's summary.json, whose figures runs.csv keeps, one row a run:
# the run folders are not kept); then `python collect.py` writes table.md.
# RECORD=<folder> writes into another record, FITS=<folder> takes the cost
# model's fits from another, LONG_CHECK=0 leaves out the 100-step check.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
OUT=${RECORD:-$HERE}
FITS=${FITS:-$HERE/../2026-11-25_zen1-2c_cluster-costmodel-cubic}
for RATE in 100mbit 1gbit; do
    for COMPRESS in none bf16; do
        $PY -m ddp_lab.bench.scaling --hosts 1,2,3,4 --rate $RATE --syncs flat/builtin --kinds weak \
            --per-rank-batch 128 --max-steps 80 --repeats 2 --fit "$FITS/$RATE/fit.csv" \
            --out "$OUT/lenet-$RATE-$COMPRESS" -- sync.compress=$COMPRESS trainer.warmup_steps=10
    done
done
for RUN in 100mbit-none 100mbit-bf16 1gbit-none; do
    RATE=${RUN%-*} COMPRESS=${RUN#*-}
    $PY -m ddp_lab.bench.scaling --hosts 1,2,3,4 --rate $RATE --syncs flat/builtin --kinds weak \
        --per-rank-batch 32 --max-steps 12 --repeats 1 --fit "$FITS/$RATE-fit-from-1mib/fit.csv" \
        --out "$OUT/resnet18-$RUN" -- model=resnet18 data=synthetic data.num_test=256 \
        trainer.warmup_steps=2 sync.compress=$COMPRESS
done
# The same ranks on loopback (torchrun --standalone): the same sharing of the
# 2 cores, with communication at memory speed; what the network itself costs
# is the difference.
$PY -m ddp_lab.bench.scaling --worlds 1,2,3,4 --threads 1 --syncs flat/builtin --kinds weak \
    --per-rank-batch 128 --max-steps 80 --repeats 2 --out "$OUT/lenet-loopback-none" \
    -- sync.compress=none trainer.warmup_steps=10
$PY -m ddp_lab.bench.scaling --worlds 1,2,3,4 --threads 1 --syncs flat/builtin --kinds weak \
    --per-rank-batch 32 --max-steps 12 --repeats 1 --out "$OUT/resnet18-loopback-none" \
    -- model=resnet18 data=synthetic data.num_test=256 trainer.warmup_steps=2 sync.compress=none
$PY "$HERE/collect.py" "$OUT"
[ "${LONG_CHECK:-1}" = 1 ] || exit 0
# A longer check of the 12-step ResNet-18 figures: 1 and 2 hosts at 1gbit, 100 steps.
$PY -m ddp_lab.bench.scaling --hosts 1,2 --rate 1gbit --syncs flat/builtin --kinds weak \
    --per-rank-batch 32 --max-steps 100 --repeats 1 --fit "$FITS/1gbit-fit-from-1mib/fit.csv" \
    --out "$OUT/resnet18-1gbit-none-100steps" -- model=resnet18 data=synthetic data.num_test=256 \
    trainer.warmup_steps=10 sync.compress=none
