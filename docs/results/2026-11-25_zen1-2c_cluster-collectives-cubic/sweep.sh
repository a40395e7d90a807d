#!/bin/bash
# Kept here from ../2026-11-25_zen1-2c_cluster-collectives/run.sh (that record, the
# same sweeps with TCP bbr, was removed as superseded by this one; git keeps it):
# this record's run.sh and ../2026-11-25_zen1-2c_cluster-realtime/run.sh run it.
# Allreduce sweeps across emulated hosts (ddp_lab.cluster), one rank per host:
# 2, 3, 4 and 8 hosts, every link shaped to RATE both ways. Then
# bench.link_share: busbw over the link and over what each algorithm's formula
# allows. As root, from the repository root:
#
#   bash docs/results/2026-11-25_zen1-2c_cluster-collectives-cubic/sweep.sh 1gbit
#   bash docs/results/2026-11-25_zen1-2c_cluster-collectives-cubic/sweep.sh 100mbit
#
# Writes <this folder>/<RATE>/<N>h/ (each sweep: collectives.csv, .png, tb/,
# record.json, output.txt) and <RATE>/link_share.{csv,md}, record.json.
set -euo pipefail
RATE=$1
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
NAME=meas$$
OUT=${RECORD:-$HERE}/$RATE  # RECORD: another record folder to write into
mkdir -p "$OUT"
trap '$PY -m ddp_lab.cluster down --name $NAME >/dev/null' EXIT
$PY -m ddp_lab.cluster up --hosts 8 --rate "$RATE" --name $NAME
for N in 2 3 4 8; do
    $PY -m ddp_lab.cluster run --name $NAME --hosts $N -- -m ddp_lab.bench.collectives \
        hydra.run.dir="$OUT/${N}h" min_bytes=65536 max_bytes=16777216 factor=4 \
        'algos=[builtin,ring,halving_doubling,naive]' tensorboard=false 2>&1 | tee "$OUT/${N}h.txt"
    mv "$OUT/${N}h.txt" "$OUT/${N}h/output.txt"
done
$PY -m ddp_lab.bench.link_share --rate "$RATE" --from 4M --out "$OUT" "$OUT"/2h "$OUT"/3h "$OUT"/4h "$OUT"/8h
