#!/bin/bash
# LeNet raced to 0.88 test accuracy where the network dominates DDP's step: N emulated hosts at RATE (the
# rate where DDP's step is at least 3x its loopback step: probe.sh, probe.txt), seeds 1, 2, 3 interleaved,
# each run stopped at its target. Before it: the same strategies and seeds on loopback (steps to target and
# compute, for the predictions), loopback's own all-reduce fitted (--loopback-fit: the compute priced net
# of it) and the link fitted as training uses it (gapped.py: one all-reduce after an idle gap, 3 sizes).
# The defaults of each strategy (LeNet lenet_fast, global batch 512, SGD lr 0.2, cosine over 5 epochs;
# PowerSGD rank 2 after 100 plain steps; local SGD and DiLoCo every 8), post-local SGD after 48 steps.
# Usage (from the repository root, as root): [VENV=path/to/venv] [RATE=15mbit] [N=2 R=<record folder>] bash docs/results/2026-11-28_xeon-2c_race-lenet-network-bound/run.sh
set -euo pipefail
R=${R:-docs/results/2026-11-28_xeon-2c_race-lenet-network-bound}
N=${N:-2}
GAPPED=docs/results/2026-11-28_xeon-2c_idle-all-reduce/gapped.py
FIT=docs/results/2026-11-28_xeon-2c_race-gpt-network-bound/fit_link.py
RATE=${RATE:-15mbit}
py=${VENV:-.venv}/bin/python
B="$py -m ddp_lab.bench.time_to_accuracy --target-acc 0.88 --epochs 5 --eval-every 24 --seeds 1,2,3 --stop-at-target"
S="ddp,powersgd,local_sgd,local_sgd:sync.local_sgd_start_step=48,diloco"
SIZES=16384,131072,516272   # about PowerSGD's compressed step, ..., DDP's step and a sync of the weights (516,272)
[ -f $R/loopback-$N/race.csv ] || $B --strategies "$S" --ranks $N --out $R/loopback-$N
if [ ! -f $R/fit-loopback-$N.csv ]; then
  "$py" -m torch.distributed.run --standalone --nproc_per_node=$N "$GAPPED" $SIZES 0.05 10 2>&1 | grep 'bytes' \
    | tee $R/link-loopback-$N.txt
  "$py" $FIT $R/link-loopback-$N.txt $N $R/fit-loopback-$N.csv
fi
if [ ! -f $R/fit-${N}h-$RATE.csv ]; then
  "$py" -m ddp_lab.cluster up --name fit --hosts $N --rate $RATE > /dev/null
  "$py" -m ddp_lab.cluster run --name fit -- "$GAPPED" $SIZES 0.3 10 2>&1 | grep 'bytes' | tee $R/link-${N}h-$RATE.txt
  "$py" -m ddp_lab.cluster down --name fit > /dev/null
  "$py" $FIT $R/link-${N}h-$RATE.txt $N $R/fit-${N}h-$RATE.csv
fi
[ -f $R/${N}h-$RATE/race.csv ] || $B --strategies "$S" --hosts $N --rate $RATE --fit $R/fit-${N}h-$RATE.csv \
  --loopback-fit $R/fit-loopback-$N.csv --steps-from $R/loopback-$N/race.csv --out $R/${N}h-$RATE
find $R -name model.pt -delete   # the weights are not the record
