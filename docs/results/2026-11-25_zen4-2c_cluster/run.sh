#!/bin/bash
# The cluster records of zen1-2c (../2026-11-25_zen1-2c_cluster-realtime,
# ../2026-11-25_zen1-2c_cluster-training-realtime) again on a second CPU, a
# 2-vCPU Zen 4, with the training's predicted steps taking their compute from
# the same ranks on loopback (bench.scaling --compute-from). As root, from the
# repository root, one part at a time or all in order:
#
#   bash docs/results/2026-11-25_zen4-2c_cluster/run.sh collectives 1gbit
#   bash docs/results/2026-11-25_zen4-2c_cluster/run.sh collectives 100mbit
#   bash docs/results/2026-11-25_zen4-2c_cluster/run.sh costmodel
#   bash docs/results/2026-11-25_zen4-2c_cluster/run.sh training
#
# (`run.sh resnet18` runs the ResNet-18 studies alone, `run.sh study ...` one
# study, as training() calls it.)
# collectives writes sweeps/<RATE>/<N>h (2, 3, 4, 8 hosts, 64 KiB-16 MiB) with
# link_share.md, and interleaved/<RATE>/ (8 hosts, shuffled rounds at 4 and
# 16 MiB); costmodel writes costmodel/<RATE>-fit-from-1mib/ (fitted on 2-3
# hosts, checked on 4 and 8); training writes one bench.scaling folder per
# model, link and sync.compress, then table.md and bandwidth_matters.png.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
NAME=meas$$

collectives() {
    local RATE=$1 OUT=$HERE/sweeps/$1
    mkdir -p "$OUT" "$HERE/interleaved"
    trap '$PY -m ddp_lab.cluster down --name $NAME >/dev/null' EXIT
    $PY -m ddp_lab.cluster up --hosts 8 --rate "$RATE" --name $NAME
    for N in 2 3 4 8; do
        $PY -m ddp_lab.cluster run --name $NAME --hosts $N -- -m ddp_lab.bench.collectives \
            hydra.run.dir="$OUT/${N}h" min_bytes=65536 max_bytes=16777216 factor=4 \
            'algos=[builtin,ring,halving_doubling,naive]' tensorboard=false 2>&1 | tee "$OUT/${N}h.txt"
        mv "$OUT/${N}h.txt" "$OUT/${N}h/output.txt"
    done
    $PY -m ddp_lab.bench.link_share --rate "$RATE" --from 4M --out "$OUT" "$OUT"/{2,3,4,8}h
    $PY -m ddp_lab.cluster run --name $NAME -- -m ddp_lab.bench.collectives mode=interleaved \
        hydra.run.dir="$HERE/interleaved/$RATE" 'algos=[ring,halving_doubling]' \
        'interleaved.sizes=[4M,16M]' interleaved.rounds=7 2>&1 | tee "$HERE/interleaved/$RATE.txt"
    mv "$HERE/interleaved/$RATE.txt" "$HERE/interleaved/$RATE/output.txt"
}

costmodel() {
    local SWEEPS=${HERE#"$PWD"/}/sweeps
    for RATE in 1gbit 100mbit; do
        local OUT=$HERE/costmodel/$RATE-fit-from-1mib
        mkdir -p "$HERE/costmodel"
        $PY -m ddp_lab.costmodel "inputs=[$SWEEPS/$RATE/2h,$SWEEPS/$RATE/3h]" \
            "validate=[$SWEEPS/$RATE/4h,$SWEEPS/$RATE/8h]" link_rate=$RATE fit_min_bytes=1048576 \
            'algos=[builtin,naive,ring,halving_doubling]' hydra.run.dir="$OUT" 2>&1 | tee "$OUT.txt"
        mv "$OUT.txt" "$OUT/output.txt"
    done
}

# One model's study: on loopback first (torchrun --standalone, the same ranks
# sharing the same cores, the all-reduce at memory speed; kept if already
# there), then across hosts at each rate, predicting each step from the
# loopback step of as many ranks.
study() {
    local MODEL=$1 BATCH=$2 STEPS=$3 REPEATS=$4 HOSTS=$5 COMPRESS=$6 RATES=$7; shift 7
    local COMMON=(--syncs flat/builtin --kinds weak --per-rank-batch $BATCH --max-steps $STEPS --repeats $REPEATS)
    local LOOP=$HERE/$MODEL-loopback-$COMPRESS
    [ -f "$LOOP/scaling.csv" ] || $PY -m ddp_lab.bench.scaling --worlds $HOSTS --threads 1 "${COMMON[@]}" \
        --out "$LOOP" -- sync.compress=$COMPRESS "$@"
    for RATE in $RATES; do
        $PY -m ddp_lab.bench.scaling --hosts $HOSTS --rate $RATE "${COMMON[@]}" \
            --fit "$HERE/costmodel/$RATE-fit-from-1mib/fit.csv" --compute-from "$LOOP/scaling.csv" \
            --out "$HERE/$MODEL-$RATE-$COMPRESS" -- sync.compress=$COMPRESS "$@"
    done
}

# As the record ran it: LeNet none at 100mbit (and its loopback) 2 runs a
# point; LeNet 1gbit none and every bf16 study 3 runs a point, run again
# after the first 2-run studies each had one 2-rank run 2.5-4x slower than
# its twin (see README.md); ResNet-18 one run a point.
training() {
    study lenet 128 300 2 1,2,3,4 none "100mbit" trainer.warmup_steps=20
    study lenet 128 300 3 1,2,3,4 none "1gbit" trainer.warmup_steps=20
    study lenet 128 300 3 1,2,3,4 bf16 "100mbit 1gbit" trainer.warmup_steps=20
    resnet18
}

resnet18() {
    local RESNET=(model=resnet18 data=synthetic data.num_test=256 trainer.warmup_steps=10)
    study resnet18 32 ${RESNET_STEPS:-150} 1 1,2 none "100mbit 1gbit" "${RESNET[@]}"
    study resnet18 32 ${RESNET_STEPS:-150} 1 1,2 bf16 "100mbit" "${RESNET[@]}"
    $PY "$HERE/../2026-11-25_zen1-2c_cluster-training-cubic/collect.py" "$HERE"
}

case ${1:-all} in
    collectives) collectives "$2" ;;
    costmodel) costmodel ;;
    training) training ;;
    resnet18) resnet18 ;;
    study) shift; study "$@" ;;
    all) bash "$0" collectives 1gbit; bash "$0" collectives 100mbit; costmodel; training ;;
    *) echo "usage: $0 collectives RATE | costmodel | training | all" >&2; exit 2 ;;
esac
