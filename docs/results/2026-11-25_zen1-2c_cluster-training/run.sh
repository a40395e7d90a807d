#!/bin/bash
# Training across 1, 2, 3 and 4 emulated hosts (one rank each, weak scaling,
# 128 images per rank), links at 100 Mbit/s and 1 Gbit/s, sync.compress none
# and bf16; the cost model's step time (fitted on 2-3 host sweeps) beside the
# measured one. As root, from the repository root:
#
#   bash docs/results/2026-11-25_zen1-2c_cluster-training/run.sh
#
# Each <model>-<rate>-<compress>/ is one python -m ddp_lab.bench.scaling run
# (scaling.csv, scaling.md, scaling.png, record.json, runs/*/summary.json).
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
