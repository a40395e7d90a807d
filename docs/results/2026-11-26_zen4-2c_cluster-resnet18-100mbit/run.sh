#!/bin/bash
# ResNet-18 across 1-4 emulated hosts at 100 Mbit/s, sync.compress bf16 and
# none, 200 steps a point at every host count, on links whose packets fit
# the shaper's burst (2806121). The ResNet-18 record of 2026-11-25 ran these
# points for 100-120 steps (none at 1, 3 and 4 hosts only), before that fix.
# Each predicted step takes its compute from the same ranks on loopback (that
# record's loopback folders) and the all-reduce from the Zen 4 cluster
# record's 100 Mbit/s fit (2-3 hosts). As root, from the repository root:
#
#   bash docs/results/2026-11-26_zen4-2c_cluster-resnet18-100mbit/run.sh
#
# Writes resnet18-100mbit-<compress>/ (one bench.scaling folder each; a
# folder already there is kept), then table.md and bandwidth_matters.png.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
RESULTS=$HERE/..
FIT=$RESULTS/2026-11-25_zen4-2c_cluster/costmodel/100mbit-fit-from-1mib/fit.csv
MODEL=(model=resnet18 data=synthetic data.num_test=256 trainer.warmup_steps=10)
# A 4-host step without compression takes about 7 s: 210 steps, 25 minutes.
COMMON=(--syncs flat/builtin --kinds weak --per-rank-batch 32 --max-steps 200 --repeats 1 --timeout 3000)
for COMPRESS in bf16 none; do
    LOOP=$RESULTS/2026-11-25_zen4-2c_cluster-resnet18/resnet18-loopback-$COMPRESS
    [ -f "$HERE/resnet18-100mbit-$COMPRESS/scaling.csv" ] || $PY -m ddp_lab.bench.scaling --hosts 1,2,3,4 \
        --rate 100mbit "${COMMON[@]}" --fit "$FIT" --compute-from "$LOOP/scaling.csv" \
        --out "$HERE/resnet18-100mbit-$COMPRESS" -- sync.compress=$COMPRESS "${MODEL[@]}"
done
$PY "$RESULTS/2026-11-25_zen1-2c_cluster-training-cubic/collect.py" "$HERE"
