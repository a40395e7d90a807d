#!/bin/bash
# ResNet-18 at 2 and 4 hosts on 1 Gbit/s and the same ranks on loopback,
# sync.compress none and bf16, 200 steps a run, 2 runs a point: how far
# apart are two runs of a point, against the one run a point of
# ../2026-11-25_zen4-2c_cluster-resnet18 (the same settings and fit)? As
# root, from the repository root:
#
#   bash docs/results/2026-11-26_zen4-2c_cluster-resnet18-repeats/run.sh
#
# Writes resnet18-loopback-<compress>/ and resnet18-1gbit-<compress>/ (one
# bench.scaling folder each; a folder already there is kept), then table.md
# and runs.csv. No 1-rank point (efficiency is left blank; the README takes
# it against the earlier record's 1-host step).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
FIT=$HERE/../2026-11-25_zen4-2c_cluster/costmodel/1gbit-fit-from-1mib/fit.csv
MODEL=(model=resnet18 data=synthetic data.num_test=256 trainer.warmup_steps=10)
COMMON=(--syncs flat/builtin --kinds weak --per-rank-batch 32 --max-steps 200 --repeats 2)
for COMPRESS in none bf16; do
    LOOP=$HERE/resnet18-loopback-$COMPRESS
    [ -f "$LOOP/scaling.csv" ] || $PY -m ddp_lab.bench.scaling --worlds 2,4 --threads 1 "${COMMON[@]}" \
        --out "$LOOP" -- sync.compress=$COMPRESS "${MODEL[@]}"
    [ -f "$HERE/resnet18-1gbit-$COMPRESS/scaling.csv" ] || $PY -m ddp_lab.bench.scaling --hosts 2,4 \
        --rate 1gbit "${COMMON[@]}" --fit "$FIT" --compute-from "$LOOP/scaling.csv" \
        --out "$HERE/resnet18-1gbit-$COMPRESS" -- sync.compress=$COMPRESS "${MODEL[@]}"
done
$PY "$HERE/../2026-11-25_zen1-2c_cluster-training-cubic/collect.py" "$HERE"
