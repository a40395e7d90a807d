#!/bin/bash
# 2 ranks of LeNet (flat/builtin, 128 images per rank, 300 steps) on loopback,
# on a 2-core machine: gloo's threads at real-time or normal priority, polling
# for the all-reduce (sync.poll) on or off, the four in shuffled order in each
# of ROUNDS rounds (default 4), one run each. From the repository root:
#
#   bash docs/results/2026-11-25_zen4-2c_poll-2-ranks/run.sh
#
# Writes runs.csv (one row a run: round, setting, images/s, step and
# all-reduce ms from its summary.json) and record.json; the run folders are removed.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
RUNS=$(mktemp -d)
trap 'rm -rf "$RUNS"' EXIT
echo "round,setting,samples_per_sec,step_ms,comm_ms_per_step,test_acc" > "$HERE/runs.csv"
for ROUND in $(seq 1 "${ROUNDS:-4}"); do
    for SETTING in $(printf '%s\n' realtime-poll realtime-nopoll normal-poll normal-nopoll | shuf); do
        THREADS=${SETTING%-*}; POLL=true; [ "${SETTING#*-}" = nopoll ] && POLL=false
        DIR=$RUNS/$ROUND-$SETTING
        $PY -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train \
            model=lenet_fast sync.mode=flat sync.algo=builtin data.batch_size=256 trainer.max_steps=300 \
            trainer.epochs=1 trainer.warmup_steps=20 trainer.threads=1 trainer.progress=false \
            dist.comm_threads=$THREADS sync.poll=$POLL hydra.run.dir="$DIR" > "$DIR.log" 2>&1
        $PY - "$DIR/summary.json" "$ROUND" "$SETTING" >> "$HERE/runs.csv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]},{sys.argv[3]},{s['samples_per_sec']:.1f},{s['step_ms']:.2f},{s['comm_ms_per_step']:.2f},{s['test_acc']:.4f}")
PY
        tail -n 1 "$HERE/runs.csv"
    done
done
$PY -c "import sys; from ddp_lab.provenance import write_record; write_record(sys.argv[1], sys.argv[2])" \
    "$HERE" "bash ${HERE#"$PWD"/}/run.sh"
