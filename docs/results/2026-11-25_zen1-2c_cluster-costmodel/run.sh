#!/bin/bash
# The cost model fitted on the 2- and 3-host sweeps of each link rate, and
# checked against the held-out 4- and 8-host sweeps (validation.csv).
# From the repository root: bash docs/results/2026-11-25_zen1-2c_cluster-costmodel/run.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
SWEEPS=docs/results/2026-11-25_zen1-2c_cluster-collectives
for RATE in 1gbit 100mbit; do
    $PY -m ddp_lab.costmodel "inputs=[$SWEEPS/$RATE/2h,$SWEEPS/$RATE/3h]" \
        "validate=[$SWEEPS/$RATE/4h,$SWEEPS/$RATE/8h]" link_rate=$RATE \
        'algos=[builtin,naive,ring,halving_doubling]' hydra.run.dir="$HERE/$RATE" 2>&1 | tee "$HERE/$RATE.txt"
    mv "$HERE/$RATE.txt" "$HERE/$RATE/output.txt"
done
