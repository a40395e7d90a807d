#!/bin/bash
# LeNet raced to 0.88 test accuracy at the fast end: 2 emulated hosts at RATES (100 Mbit/s and 1 Gbit/s by
# default), seeds 1, 2, 3 interleaved, each run stopped at its target; before it the same strategies and
# seeds on loopback (steps to target and compute, for the predictions), loopback's own all-reduce fitted
# (--loopback-fit) and each link fitted as training uses it (gapped.py: one all-reduce after an idle gap,
# 3 sizes). The defaults of each strategy (LeNet lenet_fast, global batch 512, SGD lr 0.2, cosine over 5
# epochs; PowerSGD rank 2 after 100 plain steps; local SGD and DiLoCo every 8), post-local SGD after 48
# steps. In fp32 (trainer.amp=off): under amp=auto a CPU with native bf16 trains LeNet in bf16, where
# DDP itself diverged on one seed of three (bf16-loopback.log). A step already in its folder is skipped,
# so the script resumes where it stopped.
# Usage (from the repository root, as root): [VENV=path/to/venv] [RATES="100mbit 1gbit"] bash docs/results/2026-11-28_zen4-2c_race-lenet-fast-end/run.sh
set -euo pipefail
R=docs/results/2026-11-28_zen4-2c_race-lenet-fast-end
GAPPED=docs/results/2026-11-28_xeon-2c_idle-all-reduce/gapped.py
FIT=docs/results/2026-11-28_xeon-2c_race-gpt-network-bound/fit_link.py
RATES=${RATES:-100mbit 1gbit}
py=${VENV:-.venv}/bin/python
B="$py -m ddp_lab.bench.time_to_accuracy --target-acc 0.88 --epochs 5 --eval-every 24 --seeds 1,2,3 --stop-at-target"
S="ddp,powersgd,local_sgd,local_sgd:sync.local_sgd_start_step=48,diloco"
SIZES=16384,131072,516272   # about PowerSGD's compressed step, ..., DDP's step and a sync of the weights (516,272)
[ -f $R/loopback-2/race.csv ] || $B --strategies "$S" --ranks 2 --out $R/loopback-2 -- trainer.amp=off
if [ ! -f $R/fit-loopback-2.csv ]; then
  "$py" -m torch.distributed.run --standalone --nproc_per_node=2 "$GAPPED" $SIZES 0.05 10 2>&1 | grep 'bytes' \
    | tee $R/link-loopback-2.txt
  "$py" $FIT $R/link-loopback-2.txt 2 $R/fit-loopback-2.csv
fi
for RATE in $RATES; do
  if [ ! -f $R/fit-2h-$RATE.csv ]; then
    "$py" -m ddp_lab.cluster up --name fit --hosts 2 --rate $RATE > /dev/null
    "$py" -m ddp_lab.cluster run --name fit -- "$GAPPED" $SIZES 0.3 10 2>&1 | grep 'bytes' | tee $R/link-2h-$RATE.txt
    "$py" -m ddp_lab.cluster down --name fit > /dev/null
    "$py" $FIT $R/link-2h-$RATE.txt 2 $R/fit-2h-$RATE.csv
  fi
  [ -f $R/2h-$RATE/race.csv ] || $B --strategies "$S" --hosts 2 --rate $RATE --fit $R/fit-2h-$RATE.csv \
    --loopback-fit $R/fit-loopback-2.csv --steps-from $R/loopback-2/race.csv --out $R/2h-$RATE -- trainer.amp=off
done
find $R -name model.pt -delete   # the weights are not the record
