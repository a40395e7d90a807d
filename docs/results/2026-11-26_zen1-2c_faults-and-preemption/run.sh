#!/bin/bash
# How long each fault takes to end a 2-rank job and what it says (bench.faults),
# then the compile cache per rank against one shared cache, cold and warm.
# About 20 minutes on a 2-core machine; run alone (no other job on the cores).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/../../.."
PY=${PY:-.venv/bin/python}
$PY -m ddp_lab.bench.faults --timeout-s 20 --overhead --out "$HERE/faults" | tee "$HERE/faults.txt"
find "$HERE/faults" -name checkpoints -type d -prune -exec rm -rf {} +  # regenerable, megabytes
bash "$HERE/compile_cache.sh" | tee "$HERE/compile_cache.txt"
