#!/bin/bash
# Emulated hosts with cores of their own: 8 hosts x 1 rank on a 16-core machine
# (2 cores a rank), 1 Gbit/s links, MTU 1500. As root, on a machine with 16 or
# more cores, from the repository root:
#
#   bash docs/results/2026-11-26_xeon-amx-16c-h200x1_cluster-own-cores/run.sh
#
# In the order they ran (README.md: two launches of this machine, the first at
# 197b77d: nccl-one-gpu/ and timeline-mtu1500-1/; the second: sweeps/):
#   nccl-one-gpu/8h-<round>/: bench.collectives as the 2-core records ran it, whose
#     dist.device=auto picks the GPU: every host's rank on the one GPU, NCCL between them;
#   timeline-mtu1500-1/: halving-doubling's steps on 8 hosts (the after-fix record's timeline.py);
#   sweeps/<hosts>h-mtu1500-<round>/: gloo on CPU (dist.device=cpu), 8 hosts x 3
#     launches and 4 hosts x 1, nccl-tests' 5 warm-up and 20 timed calls, 1-16 MiB;
# then busbw.csv and table.md (the jumbo-frames record's collect.py), spread.txt (its
# spread.py) and costmodel/ (fitted on the 4-host sweep, checked on the 8-host ones);
# these last three ran on zen4-2c, from the files.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-python3}
NAME=own$$
AFTER_FIX=$HERE/../2026-11-25_zen4-2c_cluster-8-hosts-after-fix
SWEEP="min_bytes=1048576 max_bytes=16777216 factor=4 warmup=5 iters=20 min_iters=20 tensorboard=false"
trap '$PY -m ddp_lab.cluster down --name $NAME >/dev/null' EXIT
mkdir -p "$HERE/nccl-one-gpu" "$HERE/sweeps" "$HERE/timeline-mtu1500-1"
$PY -m ddp_lab.cluster up --hosts 8 --rate 1gbit --name $NAME
for ROUND in 1 2 3; do
    OUT=$HERE/nccl-one-gpu/8h-$ROUND
    $PY -m ddp_lab.cluster run --name $NAME -- -m ddp_lab.bench.collectives hydra.run.dir="$OUT" $SWEEP \
        "algos=[builtin,ring,halving_doubling]" > "$OUT.txt" 2>&1
done
OUT=$HERE/timeline-mtu1500-1 $PY -m ddp_lab.cluster run --name $NAME -- "$AFTER_FIX/timeline.py" > "$HERE/timeline-mtu1500-1/output.txt" 2>&1
$PY "$AFTER_FIX/timeline_summary.py" "$HERE/timeline-mtu1500-1" > "$HERE/timeline-mtu1500-1/summary.txt"
$PY -m ddp_lab.cluster down --name $NAME > /dev/null
for HOSTS in 8 4; do
    $PY -m ddp_lab.cluster up --hosts $HOSTS --rate 1gbit --name $NAME > "$HERE/sweeps/up-${HOSTS}h.txt"
    for ROUND in $([ $HOSTS = 8 ] && echo 1 2 3 || echo 1); do
        OUT=$HERE/sweeps/${HOSTS}h-mtu1500-$ROUND
        $PY -m ddp_lab.cluster run --name $NAME -- -m ddp_lab.bench.collectives hydra.run.dir="$OUT" $SWEEP \
            dist.device=cpu dist.backend=gloo "algos=[builtin,ring,halving_doubling]" > "$OUT.txt" 2>&1
    done
    $PY -m ddp_lab.cluster down --name $NAME > /dev/null
done
JUMBO=$HERE/../2026-11-26_zen4-2c_cluster-jumbo-frames
$PY "$JUMBO/collect.py" "$HERE"
$PY "$JUMBO/spread.py" "$HERE" 1500 > "$HERE/spread.txt"
$PY -m ddp_lab.costmodel "inputs=[$HERE/sweeps/4h-mtu1500-1]" \
    "validate=[$(ls -d "$HERE"/sweeps/8h-mtu1500-? | paste -sd,)]" link_rate=1gbit \
    "algos=[builtin,ring,halving_doubling]" hydra.run.dir="$HERE/costmodel" > "$HERE/costmodel.txt" 2>&1
mv "$HERE/costmodel.txt" "$HERE/costmodel/output.txt"
