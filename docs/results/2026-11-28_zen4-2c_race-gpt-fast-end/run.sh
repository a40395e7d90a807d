#!/bin/bash
# The small GPT raced to validation loss 2.8 at the fast end: 2 emulated hosts at RATES (100 Mbit/s, then
# 1 Gbit/s) and, with HOSTS=4, 4 hosts at RATES4 (100 Mbit/s: DDP and DiLoCo in fp32 and 4 bits only, as the
# 4-host race of 2026-11-28_xeon-2c_race-gpt-network-bound), seeds 1, 2, 3 interleaved, each run stopped at
# its target. Before each: the same strategies and seeds on loopback at as many ranks (steps to target and
# compute, for the predictions), loopback's own all-reduce fitted (--loopback-fit, taken out of the loopback
# compute) and each link fitted as training uses it (gapped.py: one all-reduce after an idle gap, 3 sizes).
# The race of 2026-11-28_xeon-2c_race-gpt-network-bound at rates where the network does not dominate: DDP,
# PowerSGD rank 2 (plain for 20 steps), local SGD every 8, DiLoCo every 8 in fp32 and with 4-bit outer
# gradients. trainer.amp=auto: bf16 on a CPU with native bf16. A step already in its folder is skipped, so
# the script resumes where it stopped.
# Usage (from the repository root, as root): [VENV=path/to/venv] [RATES="100mbit 1gbit"] [HOSTS="2 4"] [RATES4=100mbit] bash docs/results/2026-11-28_zen4-2c_race-gpt-fast-end/run.sh
set -euo pipefail
R=docs/results/2026-11-28_zen4-2c_race-gpt-fast-end
GAPPED=docs/results/2026-11-28_xeon-2c_idle-all-reduce/gapped.py
FIT=docs/results/2026-11-28_xeon-2c_race-gpt-network-bound/fit_link.py
RATES=${RATES:-100mbit 1gbit}
RATES4=${RATES4:-100mbit}
HOSTS=${HOSTS:-2}
py=${VENV:-.venv}/bin/python
B="$py -m ddp_lab.bench.time_to_accuracy --target-loss 2.8 --epochs 1 --max-steps 240 --eval-every 40 --seeds 1,2,3 --stop-at-target"
G="model=gpt data=text optim=adamw"
S2="ddp,powersgd:sync.powersgd_start_step=20,local_sgd,diloco,diloco:sync.compress=int4"
S4="ddp,diloco,diloco:sync.compress=int4"
SIZES=516272,1668608,3337216   # a sixth, half and all of the GPT's 3.3 MB of fp32 gradient
for N in $HOSTS; do
  if [ $N = 2 ]; then S=$S2; NRATES=$RATES; else S=$S4; NRATES=$RATES4; fi
  [ -f $R/loopback-$N/race.csv ] || $B --strategies "$S" --ranks $N --out $R/loopback-$N -- $G
  if [ ! -f $R/fit-loopback-$N.csv ]; then
    "$py" -m torch.distributed.run --standalone --nproc_per_node=$N "$GAPPED" $SIZES 0.05 10 2>&1 | grep 'bytes' \
      | tee $R/link-loopback-$N.txt
    "$py" $FIT $R/link-loopback-$N.txt $N $R/fit-loopback-$N.csv
  fi
  for RATE in $NRATES; do
    if [ ! -f $R/fit-${N}h-$RATE.csv ]; then
      "$py" -m ddp_lab.cluster up --name fit --hosts $N --rate $RATE > /dev/null
      "$py" -m ddp_lab.cluster run --name fit -- "$GAPPED" $SIZES 0.3 10 2>&1 | grep 'bytes' | tee $R/link-${N}h-$RATE.txt
      "$py" -m ddp_lab.cluster down --name fit > /dev/null
      "$py" $FIT $R/link-${N}h-$RATE.txt $N $R/fit-${N}h-$RATE.csv
    fi
    [ -f $R/${N}h-$RATE/race.csv ] || $B --strategies "$S" --hosts $N --rate $RATE --fit $R/fit-${N}h-$RATE.csv \
      --loopback-fit $R/fit-loopback-$N.csv --steps-from $R/loopback-$N/race.csv --out $R/${N}h-$RATE -- $G
  done
done
find $R -name model.pt -delete   # the weights are not the record
