#!/bin/bash
# Two more sweeps of reduce_scatter at 4 hosts (run.sh made the first), then all_reduce at 2 hosts
# for the link's own figure there. As root, from the repository root:
#   [VENV=path/to/venv] bash docs/results/2026-11-27_xeon-2c_cluster-reduce-scatter/repeat.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${VENV:-.venv}/bin/python
NAME=rr$$
$PY -m ddp_lab.cluster up --hosts 4 --rate 1gbit --name $NAME
trap '$PY -m ddp_lab.cluster down --name $NAME' EXIT
for rep in 2 3; do
  $PY -m ddp_lab.cluster run --name $NAME --hosts 4 -- -m ddp_lab.bench.collectives \
    hydra.run.dir=$HERE/reduce_scatter-4h-$rep collective=reduce_scatter 'algos=[builtin,ring_textbook]' \
    min_bytes=1048576 max_bytes=16777216 factor=4 > $HERE/reduce_scatter-4h-$rep.log 2>&1
done
$PY -m ddp_lab.cluster run --name $NAME --hosts 2 -- -m ddp_lab.bench.collectives \
  hydra.run.dir=$HERE/all_reduce-2h collective=all_reduce 'algos=[builtin,ring_textbook]' \
  min_bytes=1048576 max_bytes=16777216 factor=4 > $HERE/all_reduce-2h.log 2>&1
