#!/bin/bash
# The ring's and halving-doubling's variants (variants.py) on 8 emulated
# hosts at 1 Gbit/s, 4 MiB. As root, from the repository root:
#
#   bash docs/results/2026-11-25_zen1-2c_cluster-realtime/variants/run.sh
#
# Writes output.txt here (the record ran it three times, one after the
# other: output-1.txt, output-2.txt, output-3.txt).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
NAME=hdv$$
trap '$PY -m ddp_lab.cluster down --name $NAME >/dev/null' EXIT
$PY -m ddp_lab.cluster up --hosts 8 --rate 1gbit --name $NAME
RATE_BPS=1e9 $PY -m ddp_lab.cluster run --name $NAME -- "$HERE/variants.py" 2>&1 | tee "$HERE/output.txt"
