#!/bin/bash
# 8 emulated hosts at 1 Gbit/s again, after the gloo-thread fix (8853421):
# the sweeps and interleaved rounds of ../2026-11-25_zen4-2c_cluster ran
# before it. As root, from the repository root:
#
#   bash docs/results/2026-11-25_zen4-2c_cluster-8-hosts-after-fix/run.sh sweep K
#   bash docs/results/2026-11-25_zen4-2c_cluster-8-hosts-after-fix/run.sh sweep20 K
#   bash docs/results/2026-11-25_zen4-2c_cluster-8-hosts-after-fix/run.sh interleaved K
#   bash docs/results/2026-11-25_zen4-2c_cluster-8-hosts-after-fix/run.sh timeline
#   bash docs/results/2026-11-25_zen4-2c_cluster-8-hosts-after-fix/run.sh variants K
#   bash docs/results/2026-11-25_zen4-2c_cluster-8-hosts-after-fix/run.sh threads K
#   bash docs/results/2026-11-25_zen4-2c_cluster-8-hosts-after-fix/run.sh ahead K
#   RATE=500mbit bash docs/results/2026-11-25_zen4-2c_cluster-8-hosts-after-fix/run.sh sweep20 K
#
# sweep K writes sweeps/launch-K/ (64 KiB-16 MiB, the four algorithms, then
# link_share/), sweep20 K the same with 20 timed calls a size into
# sweep20/launch-K/; interleaved K writes interleaved/launch-K/ (11 shuffled
# rounds at 4 and 16 MiB); timeline writes timeline/ (every rank's
# halving-doubling steps on one clock, timeline.py, summed up by
# timeline_summary.py); variants K writes variants/output-K.txt
# (variants.py), threads K writes threads/output-K.txt (threads.py),
# ahead K writes ahead/output-K.txt (ahead.py). RATE (1gbit unless set)
# shapes the links; a sweep at another rate goes to sweep20-RATE/launch-K/.
# Each part saves the kernel's messages about real-time
# throttling that appeared while it ran (rt-throttle-PART-K.txt in
# its folder, empty if none).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
NAME=aft$$
PART=$1 K=${2:-1} RATE=${RATE:-1gbit}
trap '$PY -m ddp_lab.cluster down --name $NAME >/dev/null' EXIT
$PY -m ddp_lab.cluster up --hosts 8 --rate $RATE --name $NAME
before=$(dmesg | grep -c "RT throttling" || true)
case $PART in
    sweep|sweep20)
        # sweep20: nccl-tests' own defaults, 5 warm-up and 20 timed calls a
        # size (-w 5 -n 20); the default here times as many as fit in half a
        # second (7 at 4 MiB on this link, 3 at 16 MiB)
        CALLS=(); [ "$PART" = sweep20 ] && CALLS=(warmup=5 iters=20 min_iters=20)
        DIR=$PART; [ "$PART" = sweep ] && DIR=sweeps; [ "$RATE" != 1gbit ] && DIR=$DIR-$RATE
        OUT=$HERE/$DIR/launch-$K
        mkdir -p "$HERE/$DIR"
        $PY -m ddp_lab.cluster run --name $NAME -- -m ddp_lab.bench.collectives \
            hydra.run.dir="$OUT" min_bytes=65536 max_bytes=16777216 factor=4 "${CALLS[@]}" \
            'algos=[builtin,ring,halving_doubling,naive]' tensorboard=false 2>&1 | tee "$HERE/out.txt"
        mv "$HERE/out.txt" "$OUT/output.txt"
        $PY -m ddp_lab.bench.link_share --rate $RATE --from 4M --out "$OUT/link_share" "$OUT" ;;
    interleaved)
        OUT=$HERE/interleaved/launch-$K
        mkdir -p "$HERE/interleaved"
        $PY -m ddp_lab.cluster run --name $NAME -- -m ddp_lab.bench.collectives mode=interleaved \
            hydra.run.dir="$OUT" 'algos=[ring,halving_doubling]' \
            'interleaved.sizes=[4M,16M]' interleaved.rounds=11 2>&1 | tee "$HERE/out.txt"
        mv "$HERE/out.txt" "$OUT/output.txt" ;;
    timeline)
        OUT=$HERE/timeline
        mkdir -p "$OUT"
        OUT=$OUT $PY -m ddp_lab.cluster run --name $NAME -- "$HERE/timeline.py" 2>&1 | tail -3
        $PY "$HERE/timeline_summary.py" "$OUT" | tee "$OUT/summary.txt" ;;
    variants)
        OUT=$HERE/variants
        mkdir -p "$OUT"
        for B in 4 16; do
            BYTES=$((B << 20)) RATE_BPS=1e9 ROUNDS=9 $PY -m ddp_lab.cluster run --name $NAME -- \
                "$HERE/variants.py" 2>&1 | grep -v "^\[$NAME-[1-7]\]" | tee -a "$OUT/output-$K.txt"
        done ;;
    threads|ahead)
        OUT=$HERE/$PART
        mkdir -p "$OUT"
        for B in 4 16; do
            BYTES=$((B << 20)) RATE_BPS=1e9 ROUNDS=7 CALLS=5 SEGS=2 AHEAD=1 $PY -m ddp_lab.cluster run \
                --name $NAME -- "$HERE/$PART.py" 2>&1 | grep -v "^\[$NAME-[1-7]\]" | tee -a "$OUT/output-$K.txt"
        done ;;
    *) echo "usage: $0 sweep K | sweep20 K | interleaved K | timeline | variants K | threads K | ahead K" >&2; exit 2 ;;
esac
dmesg | grep "RT throttling" | tail -n +$((before + 1)) > "${OUT}/rt-throttle-$PART-$K.txt" || true
