#!/bin/bash
# Reduce-scatter and all-gather on emulated hosts (one rank each, 1 Gbit/s links): gloo's
# (builtin) against ours (ring_textbook), 1-16 MiB, as nccl-tests' reduce_scatter_perf and
# all_gather_perf measure them. As root, from the repository root:
#   [VENV=path/to/venv] bash docs/results/2026-11-27_xeon-2c_cluster-reduce-scatter/run.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${VENV:-.venv}/bin/python
NAME=rs$$
$PY -m ddp_lab.cluster up --hosts 4 --rate 1gbit --name $NAME
trap '$PY -m ddp_lab.cluster down --name $NAME' EXIT
for hosts in 2 4; do
  for collective in reduce_scatter all_gather; do
    out=$HERE/$collective-${hosts}h
    $PY -m ddp_lab.cluster run --name $NAME --hosts $hosts -- -m ddp_lab.bench.collectives \
      hydra.run.dir=$out collective=$collective 'algos=[builtin,ring_textbook]' \
      min_bytes=1048576 max_bytes=16777216 factor=4 > $out.log 2>&1
  done
done
