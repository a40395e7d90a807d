#!/bin/bash
# 8 emulated hosts at five link rates, with and without the packet-size cap
# (ddp_lab/cluster/shaping.py: every shaped device's gso_max_size 7/8 of the
# shaper's burst, at most 64 KiB). As root, from the repository root:
#
#   bash docs/results/2026-11-26_zen4-2c_cluster-link-rates/run.sh capped K
#   bash docs/results/2026-11-26_zen4-2c_cluster-link-rates/run.sh uncapped K
#   bash docs/results/2026-11-26_zen4-2c_cluster-link-rates/run.sh bursts
#
# For each rate, `cluster up` (uncapped: then every device's gso_max_size set
# back to Linux's default, 65536, as before the cap), then
# bench.collectives from 1 to 16 MiB (gloo, ring, halving-doubling) into
# PART/launch-K/RATE/ and link_share over it. bursts: uncapped, at 200 and
# 500 Mbit/s, the shaper's burst set by hand on every device (64,000 and
# 70,000 bytes, on either side of a 64 KiB packet and its headers; then
# 1 ms of the rate, the default), gloo's all-reduce of 4 and 16 MiB into
# bursts/RATE-BURST/.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
PART=$1 K=${2:-1}
if [ "$PART" = bursts ]; then
    for RATE in 200mbit 500mbit; do
        for BURST in 64000 70000 default; do
            NAME=lb$$
            trap '$PY -m ddp_lab.cluster down --name $NAME >/dev/null' EXIT
            $PY -m ddp_lab.cluster up --hosts 8 --rate $RATE --name $NAME > /dev/null
            for i in $(seq 0 7); do
                for dev in "ddplab-$NAME-$i eth0" "ddplab-$NAME-sw v$i"; do
                    set -- $dev
                    ip netns exec $1 ip link set dev $2 gso_max_size 65536
                    [ $BURST = default ] || ip netns exec $1 tc qdisc replace dev $2 root tbf rate $RATE burst $BURST latency 50ms
                done
            done
            OUT=$HERE/bursts/$RATE-$BURST
            mkdir -p "$HERE/bursts"
            $PY -m ddp_lab.cluster run --name $NAME -- -m ddp_lab.bench.collectives hydra.run.dir="$OUT" \
                min_bytes=4194304 max_bytes=16777216 factor=4 'algos=[builtin]' tensorboard=false \
                > "$HERE/out.txt" 2>&1
            mv "$HERE/out.txt" "$OUT/output.txt"
            ip netns exec ddplab-$NAME-sw tc qdisc show dev v0 > "$OUT/qdisc.txt"
            $PY -m ddp_lab.bench.link_share --rate $RATE --from 4M --out "$OUT/link_share" "$OUT" | tail -3
            $PY -m ddp_lab.cluster down --name $NAME > /dev/null
        done
    done
    exit 0
fi
[ "$PART" = capped ] || [ "$PART" = uncapped ] || { echo "usage: $0 capped|uncapped K | bursts" >&2; exit 2; }
for RATE in 100mbit 200mbit 500mbit 800mbit 1gbit; do
    NAME=lr$$
    trap '$PY -m ddp_lab.cluster down --name $NAME >/dev/null' EXIT
    $PY -m ddp_lab.cluster up --hosts 8 --rate $RATE --name $NAME > /dev/null
    if [ "$PART" = uncapped ]; then
        for i in $(seq 0 7); do
            ip netns exec ddplab-$NAME-$i ip link set dev eth0 gso_max_size 65536
            ip netns exec ddplab-$NAME-sw ip link set dev v$i gso_max_size 65536
        done
    fi
    OUT=$HERE/$PART/launch-$K/$RATE
    mkdir -p "$(dirname "$OUT")"
    $PY -m ddp_lab.cluster run --name $NAME -- -m ddp_lab.bench.collectives hydra.run.dir="$OUT" \
        min_bytes=1048576 max_bytes=16777216 factor=4 'algos=[builtin,ring,halving_doubling]' \
        tensorboard=false > "$HERE/out.txt" 2>&1
    mv "$HERE/out.txt" "$OUT/output.txt"
    ip netns exec ddplab-$NAME-0 ip -d link show dev eth0 | grep -o "gso_max_size [0-9]*" > "$OUT/gso_max_size.txt"
    $PY -m ddp_lab.bench.link_share --rate $RATE --from 4M --out "$OUT/link_share" "$OUT" | tail -6
    $PY -m ddp_lab.cluster down --name $NAME > /dev/null
done
