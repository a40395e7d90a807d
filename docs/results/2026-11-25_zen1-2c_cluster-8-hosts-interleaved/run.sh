#!/bin/bash
# 8 emulated hosts (one rank each, TCP cubic), the ring and halving-doubling
# against gloo's all-reduce in shuffled interleaved rounds at 4 and 16 MiB,
# links at RATE. As root, from the repository root:
#
#   bash docs/results/2026-11-25_zen1-2c_cluster-8-hosts-interleaved/run.sh 1gbit
#   bash docs/results/2026-11-25_zen1-2c_cluster-8-hosts-interleaved/run.sh 100mbit
#
# Writes <this folder>/<RATE>/ (interleaved.csv, record.json, output.txt);
# RECORD=<another record folder> writes <RECORD>/<RATE>/ instead.
set -euo pipefail
RATE=$1
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
NAME=meas$$
OUT=${RECORD:-$HERE}/$RATE
trap '$PY -m ddp_lab.cluster down --name $NAME >/dev/null' EXIT
$PY -m ddp_lab.cluster up --hosts 8 --rate "$RATE" --name $NAME
$PY -m ddp_lab.cluster run --name $NAME -- -m ddp_lab.bench.collectives mode=interleaved \
    hydra.run.dir="$OUT" 'algos=[ring,halving_doubling]' 'interleaved.sizes=[4M,16M]' \
    interleaved.rounds=7 2>&1 | tee "$OUT.txt"
mv "$OUT.txt" "$OUT/output.txt"
