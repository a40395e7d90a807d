#!/bin/bash
# Jumbo frames: gloo's all-reduce, the ring and halving-doubling at 4 and 8
# emulated hosts on 1 Gbit/s links with the default MTU of 1500 and with
# 9000 (`cluster up --mtu 9000`), at 1, 4 and 16 MiB, nccl-tests' 5 warm-up
# and 20 timed calls, three rounds with the MTUs alternated. As root, from
# the repository root:
#
#   bash docs/results/2026-11-26_zen4-2c_cluster-jumbo-frames/run.sh
#
# Writes sweeps/<hosts>h-mtu<mtu>-<round>/ (bench.collectives' folder, with
# collectives.csv and record.json) and its output (.txt), then busbw.csv
# (every point) and table.md (collect.py), then costmodel-mtu<mtu>/: the
# cost model fitted on the 4-host sweeps, checked on the 8-host ones, 1/beta
# beside the link and its TCP payload rate at that MTU (output.txt), then
# timeline-mtu<mtu>-<round>/: halving-doubling's steps on 8 hosts, every rank
# on one clock (the after-fix record's timeline.py, 40 calls of 4 MiB), two
# rounds alternating the MTUs, and spread.txt (spread.py: the transfers'
# spread at each MTU and what it costs a call, replayed), then
# sweeps-100mbit/<hosts>h-mtu<mtu>-<round>/: 2 and 8 hosts at 100 Mbit/s, 4 MiB
# only, three rounds, where the shaper's 16 KiB burst holds fewer than two jumbo
# frames (collect.py writes table-100mbit.md).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
NAME=jumbo$$
trap '$PY -m ddp_lab.cluster down --name $NAME >/dev/null' EXIT
mkdir -p "$HERE/sweeps"
for ROUND in 1 2 3; do for HOSTS in 8 4; do for MTU in 1500 9000; do
    OUT=$HERE/sweeps/${HOSTS}h-mtu$MTU-$ROUND
    [ -f "$OUT/collectives.csv" ] && continue  # a finished launch is kept
    rm -rf "$OUT"
    $PY -m ddp_lab.cluster up --hosts $HOSTS --rate 1gbit --mtu $MTU --name $NAME > "$OUT.txt"
    $PY -m ddp_lab.cluster run --name $NAME -- -m ddp_lab.bench.collectives hydra.run.dir="$OUT" \
        min_bytes=1048576 max_bytes=16777216 factor=4 warmup=5 iters=20 min_iters=20 \
        "algos=[builtin,ring,halving_doubling]" tensorboard=false >> "$OUT.txt" 2>&1
    $PY -m ddp_lab.cluster down --name $NAME > /dev/null
done; done; done
$PY "$HERE/collect.py" "$HERE"
for MTU in 1500 9000; do
    OUT=$HERE/costmodel-mtu$MTU
    [ -f "$OUT/validation.csv" ] && continue
    rm -rf "$OUT"
    $PY -m ddp_lab.costmodel "inputs=[$(ls -d "$HERE"/sweeps/4h-mtu$MTU-? | paste -sd,)]" \
        "validate=[$(ls -d "$HERE"/sweeps/8h-mtu$MTU-? | paste -sd,)]" link_rate=1gbit link_mtu=$MTU \
        "algos=[builtin,ring,halving_doubling]" hydra.run.dir="$OUT" > "$OUT.txt" 2>&1
    mv "$OUT.txt" "$OUT/output.txt"
done
AFTER_FIX=$HERE/../2026-11-25_zen4-2c_cluster-8-hosts-after-fix
for ROUND in 1 2; do for MTU in 1500 9000; do
    OUT=$HERE/timeline-mtu$MTU-$ROUND
    [ -f "$OUT/trace-7.json" ] && continue
    rm -rf "$OUT" && mkdir -p "$OUT"
    $PY -m ddp_lab.cluster up --hosts 8 --rate 1gbit --mtu $MTU --name $NAME > "$OUT/output.txt"
    OUT=$OUT $PY -m ddp_lab.cluster run --name $NAME -- "$AFTER_FIX/timeline.py" >> "$OUT/output.txt" 2>&1
    $PY "$AFTER_FIX/timeline_summary.py" "$OUT" > "$OUT/summary.txt"
    $PY -m ddp_lab.cluster down --name $NAME > /dev/null
done; done
$PY "$HERE/spread.py" "$HERE" > "$HERE/spread.txt"
mkdir -p "$HERE/sweeps-100mbit"
for ROUND in 1 2 3; do for HOSTS in 8 2; do for MTU in 1500 9000; do
    OUT=$HERE/sweeps-100mbit/${HOSTS}h-mtu$MTU-$ROUND
    [ -f "$OUT/collectives.csv" ] && continue
    rm -rf "$OUT"
    $PY -m ddp_lab.cluster up --hosts $HOSTS --rate 100mbit --mtu $MTU --name $NAME > "$OUT.txt"
    $PY -m ddp_lab.cluster run --name $NAME -- -m ddp_lab.bench.collectives hydra.run.dir="$OUT" \
        min_bytes=4194304 max_bytes=4194304 warmup=5 iters=20 min_iters=20 \
        "algos=[builtin,ring,halving_doubling]" tensorboard=false >> "$OUT.txt" 2>&1
    $PY -m ddp_lab.cluster down --name $NAME > /dev/null
done; done; done
$PY "$HERE/collect.py" "$HERE" sweeps-100mbit 0.0125 > /dev/null
