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
# the same stops once the ranks that give up kill a rank stopped on their host
$PY -m ddp_lab.bench.faults --kinds stop,stop@compile,stop@evaluation,stop@checkpoint --timeout-s 20 \
    --out "$HERE/faults-stopped-killed" | tee "$HERE/faults-stopped-killed.txt"
find "$HERE/faults-stopped-killed" -name checkpoints -type d -prune -exec rm -rf {} +
