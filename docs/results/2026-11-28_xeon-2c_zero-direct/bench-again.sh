#!/bin/bash
# The reduce-scatter again after the direct one's sum went in place (no copy of the chunk:
# commit after bench.sh's): gloo's and the direct one's, 3 sweeps each at 2 and 4 hosts, 1-16 MiB.
# As root, from the repository root:
#   [VENV=path/to/venv] bash docs/results/2026-11-28_xeon-2c_zero-direct/bench-again.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${VENV:-.venv}/bin/python
NAME=rsa$$
$PY -m ddp_lab.cluster up --hosts 4 --rate 1gbit --name $NAME > /dev/null
trap '$PY -m ddp_lab.cluster down --name $NAME > /dev/null' EXIT
mkdir -p "$HERE/bench-again"
for rep in 1 2 3; do
  for hosts in 2 4; do
    out=reduce_scatter-${hosts}h-$rep
    $PY -m ddp_lab.cluster run --name $NAME --hosts $hosts -- -m ddp_lab.bench.collectives \
      hydra.run.dir="$HERE/bench-again/$out" collective=reduce_scatter 'algos=[builtin,direct]' \
      min_bytes=1048576 max_bytes=16777216 factor=4 tensorboard=false plot=false > "$HERE/bench-again/$out.log" 2>&1
  done
done
