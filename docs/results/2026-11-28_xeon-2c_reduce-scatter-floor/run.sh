#!/bin/bash
# Why the direct reduce-scatter misses 90% of the link at 4 hosts and 1 MiB: its time on loopback (no
# link: what the ranks' software takes on these 2 cores) beside its time across emulated hosts at
# 1 Gbit/s, at 2 and 4 ranks, 1-16 MiB; and the shapers' drop counters across the 4-host sweep.
# As root, from the repository root:  [VENV=path/to/venv] bash docs/results/2026-11-28_xeon-2c_reduce-scatter-floor/run.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${VENV:-.venv}/bin/python
B="-m ddp_lab.bench.collectives collective=reduce_scatter algos=[direct] min_bytes=1048576 max_bytes=16777216
  factor=4 tensorboard=false plot=false"
for n in 2 4; do
  $PY -m torch.distributed.run --standalone --nproc_per_node=$n $B hydra.run.dir="$HERE/loopback-$n" \
    > "$HERE/loopback-$n.log" 2>&1
done
NAME=rsf$$
$PY -m ddp_lab.cluster up --hosts 4 --rate 1gbit --name $NAME > /dev/null
trap '$PY -m ddp_lab.cluster down --name $NAME > /dev/null' EXIT
drops() { for i in 0 1 2 3; do
  echo "host $i: $(ip netns exec ddplab-$NAME-$i tc -s qdisc show dev eth0 | grep -o 'dropped [0-9]*')," \
       "its switch port: $(ip netns exec ddplab-$NAME-sw tc -s qdisc show dev v$i | grep -o 'dropped [0-9]*')"; done; }
for n in 2 4; do
  drops > "$HERE/drops-before-${n}h.txt"
  $PY -m ddp_lab.cluster run --name $NAME --hosts $n -- $B hydra.run.dir="$HERE/hosts-$n" > "$HERE/hosts-$n.log" 2>&1
  drops > "$HERE/drops-after-${n}h.txt"
done
