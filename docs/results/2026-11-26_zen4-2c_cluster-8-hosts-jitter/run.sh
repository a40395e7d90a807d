#!/bin/bash
# Halving-doubling at 8 emulated hosts on 1 Gbit/s, 4 MiB: is it short of
# cycles, of the shaper's burst, or of TCP's output queue? As root, from the
# repository root:
#
#   bash docs/results/2026-11-26_zen4-2c_cluster-8-hosts-jitter/run.sh cpu
#   bash docs/results/2026-11-26_zen4-2c_cluster-8-hosts-jitter/run.sh burst
#   bash docs/results/2026-11-26_zen4-2c_cluster-8-hosts-jitter/run.sh tsq
#   bash docs/results/2026-11-26_zen4-2c_cluster-8-hosts-jitter/run.sh spread
#
# cpu: gloo's all-reduce, the ring and halving-doubling, 600 calls of 4 MiB
# each; the machine's CPU time (/proc/stat) over 10 s inside the timed calls
# -> cpu.csv. burst: halving-doubling and the ring at 4 and 16 MiB, 40 calls,
# every link's tbf burst at the shipped 125,000 bytes (1 ms) and at 75,000
# (0.6 ms: a 64 KiB packet and its headers still fit), two rounds -> burst.csv.
# tsq: halving-doubling the same way with TCP's per-socket limit on bytes
# queued below it (net.ipv4.tcp_limit_output_bytes, in every host) at this
# kernel's 4 MiB and at 256 KiB -> tsq.csv. Every part: output-PART/ keeps
# each launch's folder (collectives.csv, record.json) and its output (*.txt).
# spread: one pair's 2 MiB exchanges alone and with the other three pairs
# exchanging too (spread.py) -> spread.txt.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
NAME=jit$$ PART=$1 HOSTS=8
trap '$PY -m ddp_lab.cluster down --name $NAME >/dev/null' EXIT
$PY -m ddp_lab.cluster up --hosts $HOSTS --rate 1gbit --name $NAME
mkdir -p "$HERE/output-$PART"

launch() {  # launch OUT ALGO CALLS SIZES...: a bench.collectives sweep of one algorithm
    local out=$1 algo=$2 calls=$3 lo=$4 hi=$5
    rm -rf "$out"
    $PY -m ddp_lab.cluster run --name $NAME -- -m ddp_lab.bench.collectives hydra.run.dir="$out" \
        min_bytes=$lo max_bytes=$hi factor=4 warmup=5 iters=$calls min_iters=$calls \
        "algos=[$algo]" tensorboard=false > "$out.txt" 2>&1
}
busbw() {  # busbw CSV SIZE: the bus bandwidth at SIZE in a sweep's collectives.csv, GB/s
    awk -F, -v s=$2 'NR > 1 && $2 == s {print $8}' "$1"
}
shape_all() {  # shape_all BURST: every host's link and every switch port
    for i in $(seq 0 $((HOSTS - 1))); do
        ip netns exec ddplab-$NAME-$i tc qdisc replace dev eth0 root tbf rate 1gbit burst $1 latency 50ms
        ip netns exec ddplab-$NAME-sw tc qdisc replace dev v$i root tbf rate 1gbit burst $1 latency 50ms
    done
}

case $PART in
    cpu)
        echo "algo,busbw_gbps,user,nice,system,idle,iowait,irq,softirq,steal" > "$HERE/cpu.csv"
        for ALGO in builtin ring halving_doubling; do
            OUT=$HERE/output-cpu/$ALGO
            launch "$OUT" $ALGO 600 4194304 4194304 &
            pid=$!
            sleep 30  # startup and warm-up take under 25 s; 600 calls take about 38
            a=($(head -1 /proc/stat)); sleep 10; b=($(head -1 /proc/stat))
            kill -0 $pid || { echo "the $ALGO run ended before the CPU sample did" >&2; exit 1; }
            wait $pid
            ticks=$(for k in 1 2 3 4 5 6 7 8; do echo -n ",$(( b[k] - a[k] ))"; done)
            echo "$ALGO,$(busbw "$OUT/collectives.csv" 4194304)$ticks" >> "$HERE/cpu.csv"
        done ;;
    burst)
        echo "round,burst_bytes,algo,size_bytes,busbw_gbps" > "$HERE/burst.csv"
        for ROUND in 1 2; do for BURST in 125000 75000; do
            shape_all $BURST
            for ALGO in halving_doubling ring; do
                OUT=$HERE/output-burst/$ALGO-$BURST-$ROUND
                launch "$OUT" $ALGO 40 4194304 16777216
                for SIZE in 4194304 16777216; do
                    echo "$ROUND,$BURST,$ALGO,$SIZE,$(busbw "$OUT/collectives.csv" $SIZE)" >> "$HERE/burst.csv"
                done
            done
        done; done ;;
    tsq)
        echo "round,tcp_limit_output_bytes,algo,size_bytes,busbw_gbps" > "$HERE/tsq.csv"
        for ROUND in 1 2; do for LIMIT in 4194304 262144; do
            for i in $(seq 0 $((HOSTS - 1))); do
                ip netns exec ddplab-$NAME-$i sysctl -qw net.ipv4.tcp_limit_output_bytes=$LIMIT
            done
            OUT=$HERE/output-tsq/halving_doubling-$LIMIT-$ROUND
            launch "$OUT" halving_doubling 40 4194304 16777216
            for SIZE in 4194304 16777216; do
                echo "$ROUND,$LIMIT,halving_doubling,$SIZE,$(busbw "$OUT/collectives.csv" $SIZE)" >> "$HERE/tsq.csv"
            done
        done; done ;;
    spread)
        $PY -m ddp_lab.cluster run --name $NAME -- "$HERE/spread.py" > "$HERE/output-spread/output.txt" 2>&1
        grep -E "round [12] " "$HERE/output-spread/output.txt" | sed 's/^\[[^]]*\] //' | tee "$HERE/spread.txt" ;;
    *) echo "run.sh cpu|burst|tsq|spread" >&2; exit 2 ;;
esac
rm -f "$HERE"/output-$PART/*/collectives.png
