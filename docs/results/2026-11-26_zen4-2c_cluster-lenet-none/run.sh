#!/bin/bash
# LeNet without gradient compression (sync.compress=none, a 516 KB fp32
# all-reduce) on 1-4 ranks on loopback, then across 1-4 emulated hosts at
# 1 Gbit/s and 100 Mbit/s, 5 runs a point, as the bf16 record beside it
# (../2026-11-26_zen4-2c_cluster-lenet-predictions) ran bf16. The all-reduce
# is priced by that record's fits from 64 KiB (costmodel-<rate>-all-sizes/),
# chosen there before these runs: a held-out check of "fit over the sizes
# the gradient has". As root, from the repository root:
#
#   bash docs/results/2026-11-26_zen4-2c_cluster-lenet-none/run.sh
#
# Writes lenet-loopback-none/ and lenet-<rate>-none/ (one bench.scaling
# folder each; a folder already there is kept), then table.md and runs.csv.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
FITS=$HERE/../2026-11-26_zen4-2c_cluster-lenet-predictions
PY=${PY:-.venv/bin/python}
COMMON=(--syncs flat/builtin --kinds weak --per-rank-batch 128 --max-steps 300 --repeats 5)
LOOP=$HERE/lenet-loopback-none
[ -f "$LOOP/scaling.csv" ] || $PY -m ddp_lab.bench.scaling --worlds 1,2,3,4 --threads 1 "${COMMON[@]}" \
    --out "$LOOP" -- sync.compress=none trainer.warmup_steps=20
for RATE in 1gbit 100mbit; do
    [ -f "$HERE/lenet-$RATE-none/scaling.csv" ] || $PY -m ddp_lab.bench.scaling --hosts 1,2,3,4 --rate $RATE \
        "${COMMON[@]}" --fit "$FITS/costmodel-$RATE-all-sizes/fit.csv" --compute-from "$LOOP/scaling.csv" \
        --out "$HERE/lenet-$RATE-none" -- sync.compress=none trainer.warmup_steps=20
done
$PY "$HERE/../2026-11-25_zen1-2c_cluster-training-cubic/collect.py" "$HERE"
