#!/bin/bash
# 3 ranks of LeNet (flat/builtin) on loopback, on a 2-core machine: polling for
# the all-reduce (sync.poll) on and off, gloo's threads at real-time and at
# normal priority, in alternated launches. From the repository root:
#
#   bash docs/results/2026-11-25_zen1-2c_poll-3-ranks/run.sh
#
# Writes <launch>-<setting>/ (bench.scaling's scaling.csv/md, record.json and
# runs.csv, one row a run: the run folders are not kept).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
launch() {  # folder, dist.comm_threads, sync.poll
    $PY -m ddp_lab.bench.scaling --worlds 3 --threads 1 --syncs flat/builtin --kinds weak \
        --per-rank-batch 128 --max-steps 80 --repeats 2 --out "$HERE/$1" \
        -- sync.compress=none trainer.warmup_steps=10 dist.comm_threads=$2 sync.poll=$3
    $PY - "$HERE/$1" <<'PY'
import csv, json, sys
from pathlib import Path
out = Path(sys.argv[1])
cols = ["run", "world_size", "global_batch", "steps", "measured_steps", "samples_per_sec", "step_ms",
        "comm_ms_per_step", "comm_frac", "mfu", "test_acc", "model", "sync", "comm_threads"]
with open(out / "runs.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for p in sorted(out.glob("runs/*/summary.json")):
        w.writerow({"run": p.parent.name, **json.loads(p.read_text())})
PY
}
for i in 1 2; do
    launch $i-auto auto auto              # at e.g. 4937200: real-time threads and polling
    launch $i-normal-nopoll normal false
done
for i in 3 4; do
    launch $i-realtime-nopoll realtime false
    launch $i-normal-poll normal true
done
