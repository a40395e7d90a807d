#!/bin/bash
# Training across 1, 2, 3 and 4 emulated hosts (one rank each, weak scaling,
# 128 images per rank), links at 100 Mbit/s and 1 Gbit/s, sync.compress none
# and bf16; the cost model's step time (fitted on 2-3 host sweeps) beside the
# measured one. As root, from the repository root:
#
#   bash docs/results/2026-11-25_zen1-2c_cluster-training/run.sh
#
# Each <model>-<rate>-<compress>/ is one python -m ddp_lab.bench.scaling run
# (scaling.csv, scaling.md, scaling.png, record.json, runs/*/summary.json;
# runs.csv keeps their figures, one row a run: the run folders are not kept).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
FITS=$HERE/../2026-11-25_zen1-2c_cluster-costmodel
for RATE in 100mbit 1gbit; do
    for COMPRESS in none bf16; do
        $PY -m ddp_lab.bench.scaling --hosts 1,2,3,4 --rate $RATE --syncs flat/builtin --kinds weak \
            --per-rank-batch 128 --max-steps 80 --repeats 2 --fit "$FITS/$RATE/fit.csv" \
            --out "$HERE/lenet-$RATE-$COMPRESS" -- sync.compress=$COMPRESS trainer.warmup_steps=10
    done
done
# ResNet-18 (synthetic images, 32 per rank, 12 steps of which 2 left out), 1 and 2 hosts, one run each
for RATE in 100mbit 1gbit; do
    $PY -m ddp_lab.bench.scaling --hosts 1,2 --rate $RATE --syncs flat/builtin --kinds weak \
        --per-rank-batch 32 --max-steps 12 --repeats 1 --fit "$FITS/$RATE/fit.csv" --timeout 600 \
        --out "$HERE/resnet18-$RATE" -- model=resnet18 data=synthetic data.num_test=256 trainer.warmup_steps=2
done
