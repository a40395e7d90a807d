#!/bin/bash
# LeNet with bf16 gradients on 1-4 ranks on loopback, then across 1-4
# emulated hosts at 1 Gbit/s and 100 Mbit/s, 5 runs a point (the Zen 4 cluster record's
# after-fix/ studies ran 3): is the cost model's +25-28% at 4 hosts there
# the spread of one loopback point, or does a 4-rank loopback step really
# take longer than a 4-host one? As root, from the repository root:
#
#   bash docs/results/2026-11-26_zen4-2c_cluster-lenet-predictions/run.sh
#
# Writes lenet-loopback-bf16/ and lenet-<rate>-bf16/ (one bench.scaling
# folder each; a folder already there is kept), then table.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
COMMON=(--syncs flat/builtin --kinds weak --per-rank-batch 128 --max-steps 300 --repeats 5)
LOOP=$HERE/lenet-loopback-bf16
[ -f "$LOOP/scaling.csv" ] || $PY -m ddp_lab.bench.scaling --worlds 1,2,3,4 --threads 1 "${COMMON[@]}" \
    --out "$LOOP" -- sync.compress=bf16 trainer.warmup_steps=20
for RATE in 1gbit 100mbit; do
    FIT=$HERE/../2026-11-25_zen4-2c_cluster/costmodel/$RATE-fit-from-1mib/fit.csv
    [ -f "$HERE/lenet-$RATE-bf16/scaling.csv" ] || $PY -m ddp_lab.bench.scaling --hosts 1,2,3,4 --rate $RATE \
        "${COMMON[@]}" --fit "$FIT" --compute-from "$LOOP/scaling.csv" \
        --out "$HERE/lenet-$RATE-bf16" -- sync.compress=bf16 trainer.warmup_steps=20
done
$PY "$HERE/../2026-11-25_zen1-2c_cluster-training-cubic/collect.py" "$HERE"
