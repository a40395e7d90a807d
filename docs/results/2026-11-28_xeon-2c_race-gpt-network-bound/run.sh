#!/bin/bash
# The small GPT raced to validation loss 2.8 where the network dominates DDP's step: 2 emulated hosts
# at 40 Mbit/s and 4 at 30 Mbit/s (the rates where DDP's step is at least 3x its loopback step),
# seeds 1, 2, 3 interleaved, each run stopped at its target. Before each hosts race: the same
# strategies and seeds on loopback (steps to target and compute, for the predictions) and the link
# fitted as training uses it (gapped.py: one all-reduce after an idle gap, 3 sizes).
# Usage (from the repository root, as root): [VENV=path/to/venv] bash docs/results/2026-11-28_xeon-2c_race-gpt-network-bound/run.sh
set -euo pipefail
R=docs/results/2026-11-28_xeon-2c_race-gpt-network-bound
GAPPED=docs/results/2026-11-28_xeon-2c_idle-all-reduce/gapped.py
py=${VENV:-.venv}/bin/python
B="$py -m ddp_lab.bench.time_to_accuracy --target-loss 2.8 --epochs 1 --max-steps 240 --eval-every 40 --seeds 1,2,3 --stop-at-target"
G="model=gpt data=text optim=adamw"
S2="ddp,powersgd:sync.powersgd_start_step=20,local_sgd,local_sgd:sync.local_sgd_start_step=40,diloco,diloco:sync.compress=int4,diloco:sync.overlap=4"
S4="ddp,diloco,diloco:sync.compress=int4,diloco:sync.overlap=4"
fit() {  # hosts rate
  "$py" -m ddp_lab.cluster up --name fit --hosts $1 --rate $2 > /dev/null
  "$py" -m ddp_lab.cluster run --name fit -- "$GAPPED" 516272,1668608,3337216 0.3 10 2>&1 | grep 'bytes' \
    | tee $R/link-$1h-$2.txt
  "$py" -m ddp_lab.cluster down --name fit > /dev/null
  "$py" $R/fit_link.py $R/link-$1h-$2.txt $1 $R/fit-$1h-$2.csv
}
for spec in "2 40mbit $S2" "4 30mbit $S4"; do
  read -r N RATE S <<< "$spec"
  [ -f $R/loopback-$N/race.csv ] || $B --strategies "$S" --ranks $N --out $R/loopback-$N -- $G
  [ -f $R/fit-${N}h-$RATE.csv ] || fit $N $RATE
  [ -f $R/${N}h-$RATE/race.csv ] || $B --strategies "$S" --hosts $N --rate $RATE --fit $R/fit-${N}h-$RATE.csv \
    --steps-from $R/loopback-$N/race.csv --out $R/${N}h-$RATE -- $G
done
find $R -name model.pt -delete   # the weights are not the record
