#!/bin/bash
# Reduce-scatter and all-gather on emulated hosts (one rank each, 1 Gbit/s links): gloo's
# (builtin), the textbook ring's and the direct one's (ddp_lab/collectives/direct.py), 1-16 MiB,
# as nccl-tests' reduce_scatter_perf and all_gather_perf measure them; 3 sweeps each at 2 and 4
# hosts, the repeats interleaved; then one all_reduce sweep at each. As root, from the repository root:
#   [VENV=path/to/venv] bash docs/results/2026-11-28_xeon-2c_zero-direct/bench.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${VENV:-.venv}/bin/python
NAME=rsd$$
$PY -m ddp_lab.cluster up --hosts 4 --rate 1gbit --name $NAME | tee "$HERE/bench-cluster.txt"
trap '$PY -m ddp_lab.cluster down --name $NAME' EXIT
sweep() {  # hosts collective out
  $PY -m ddp_lab.cluster run --name $NAME --hosts "$1" -- -m ddp_lab.bench.collectives \
    hydra.run.dir="$HERE/bench/$3" collective="$2" 'algos=[builtin,ring_textbook,direct]' \
    min_bytes=1048576 max_bytes=16777216 factor=4 tensorboard=false plot=false > "$HERE/bench/$3.log" 2>&1
}
mkdir -p "$HERE/bench"
for rep in 1 2 3; do
  for hosts in 2 4; do
    for collective in reduce_scatter all_gather; do
      sweep $hosts $collective $collective-${hosts}h-$rep
    done
  done
done
for hosts in 2 4; do
  sweep $hosts all_reduce all_reduce-${hosts}h
done
