#!/bin/bash
# ResNet-18 across 1-4 emulated hosts at 1 Gbit/s, sync.compress none and
# bf16, 200 steps a point (the Zen 4 cluster record ran 150 steps at 1-2
# hosts), each predicted step taking its compute from the same ranks on
# loopback. As root, from the repository root:
#
#   bash docs/results/2026-11-25_zen4-2c_cluster-resnet18/run.sh
#   STEPS=120 bash docs/results/2026-11-25_zen4-2c_cluster-resnet18/run.sh 100mbit bf16
#   STEPS=100 HOSTS=1,3,4 bash docs/results/2026-11-25_zen4-2c_cluster-resnet18/run.sh 100mbit none
#
# Writes resnet18-loopback-<compress>/ and resnet18-<rate>-<compress>/ (one
# bench.scaling folder each; a folder already there is kept), then table.md
# and bandwidth_matters.png. The cost model's fits are the Zen 4 cluster
# record's (fitted on 2-3 hosts). The second and third commands are what the
# record ran at 100 Mbit/s, where a step takes 2.5-7 s: bf16 for 120 steps,
# and none for 100 steps at 3-4 hosts (2 hosts are in the Zen 4 record).
# Those 100 Mbit/s folders were later replaced by
# ../2026-11-26_zen4-2c_cluster-resnet18-100mbit (200 steps, links that carry their rate).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
RATE=${1:-1gbit}
COMPRESSES=${2:-none bf16}
FIT=$HERE/../2026-11-25_zen4-2c_cluster/costmodel/$RATE-fit-from-1mib/fit.csv
MODEL=(model=resnet18 data=synthetic data.num_test=256 trainer.warmup_steps=10)
COMMON=(--syncs flat/builtin --kinds weak --per-rank-batch 32 --max-steps ${STEPS:-200} --repeats 1)
for COMPRESS in $COMPRESSES; do
    LOOP=$HERE/resnet18-loopback-$COMPRESS
    [ -f "$LOOP/scaling.csv" ] || $PY -m ddp_lab.bench.scaling --worlds 1,2,3,4 --threads 1 "${COMMON[@]}" \
        --out "$LOOP" -- sync.compress=$COMPRESS "${MODEL[@]}"
    [ -f "$HERE/resnet18-$RATE-$COMPRESS/scaling.csv" ] || $PY -m ddp_lab.bench.scaling --hosts ${HOSTS:-1,2,3,4} \
        --rate $RATE "${COMMON[@]}" --fit "$FIT" --compute-from "$LOOP/scaling.csv" \
        --out "$HERE/resnet18-$RATE-$COMPRESS" -- sync.compress=$COMPRESS "${MODEL[@]}"
done
$PY "$HERE/../2026-11-25_zen1-2c_cluster-training-cubic/collect.py" "$HERE"
