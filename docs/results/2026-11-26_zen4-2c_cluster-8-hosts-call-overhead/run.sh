#!/bin/bash
# The shipped halving-doubling call against the same steps with the thread's
# priority held over a block and against a bare loop of them, and the ring
# shipped and held: 8 emulated hosts on 1 Gbit/s, 4 MiB, blocks of 20 calls,
# 10 shuffled rounds a launch, three launches (ab.py). As root, from the
# repository root:
#
#   bash docs/results/2026-11-26_zen4-2c_cluster-8-hosts-call-overhead/run.sh
#
# Writes output-<launch>.txt.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
NAME=ovh$$
trap '$PY -m ddp_lab.cluster down --name $NAME >/dev/null' EXIT
$PY -m ddp_lab.cluster up --hosts 8 --rate 1gbit --name $NAME > /dev/null
for K in 1 2 3; do
    ROUNDS=10 SEED=$K $PY -m ddp_lab.cluster run --name $NAME -- "$HERE/ab.py" > "$HERE/output-$K.txt" 2>&1
done
grep -h -A6 'ranks, 4 MiB' "$HERE"/output-*.txt
