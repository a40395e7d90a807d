#!/bin/bash
# Islands raced: the small GPT to validation loss 2.7 (past AdamW's 100-step warm-up), seeds 1-3.
# 1. loopback-4/: every strategy on 4 ranks of this machine's loopback, a fixed budget of 168 steps (trained on
#    past the target: steps to target, and the loss at equal steps): DDP; DDP with its lr scaled by 1.4 (the
#    control: DiLoCo's outer Nesterov step, lr 0.7 and momentum 0.5, moves the weights lr/(1-momentum) = 1.4
#    times the mean change in steady state); per-rank DiLoCo as it was (every 8, overlap 2, fp32) and with the
#    islands' settings (eager, int4, error feedback); 2 islands of 2 (DDP inside) eager, delayed and blocking.
# 2. The link fitted as training uses it (gapped.py): 2 hosts of 2 ranks (an all-reduce over all 4: DDP's and
#    per-rank DiLoCo's) and 2 hosts of 1 (what crosses between islands), and loopback itself at 4 ranks.
# 3. 2x2-20mbit/: 2 emulated hosts of 2 ranks, 20 Mbit/s between them, each run stopped at its target, seeds
#    interleaved: flat DDP over the 4 ranks, per-rank DiLoCo (both), islands; predictions from loopback-4.
# 4. 1x2/: DDP on one emulated host of 2 ranks (no slow link), seeds 1-3.
# A step already in its folder is skipped, so the script resumes where it stopped.
# Usage (from the repository root, as root): [VENV=path/to/venv] bash docs/results/2026-11-29_zen4-2c_islands-race/run.sh
set -euo pipefail
R=docs/results/2026-11-29_zen4-2c_islands-race
GAPPED=docs/results/2026-11-28_xeon-2c_idle-all-reduce/gapped.py
FIT=docs/results/2026-11-28_xeon-2c_race-gpt-network-bound/fit_link.py
py=${VENV:-.venv}/bin/python
B="$py -m ddp_lab.tools.bench.time_to_accuracy --target-loss 2.7 --epochs 1 --eval-every 24 --seeds 1,2,3"
G="model=gpt data=text optim=adamw"
SAME="sync.overlap=2:sync.overlap_update=eager:sync.compress=int4:sync.rounding=feedback"
ISL="diloco:sync.islands=2:$SAME"
RACE="ddp,diloco:sync.overlap=2,diloco:$SAME,$ISL"
LOOP="$RACE,ddp:optim.lr=0.0014,diloco:sync.islands=2:sync.overlap=2:sync.compress=int4:sync.rounding=feedback,diloco:sync.islands=2:sync.compress=int4:sync.rounding=feedback"
[ -f $R/loopback-4/race.csv ] || $B --ranks 4 --max-steps 168 --strategies "$LOOP" --out $R/loopback-4 -- $G
if [ ! -f $R/fit-loopback-4.csv ]; then
  "$py" -m torch.distributed.run --standalone --nproc_per_node=4 "$GAPPED" 516272,1668608,3337216 0.05 10 2>&1 \
    | grep 'bytes' | tee $R/link-loopback-4.txt
  "$py" $FIT $R/link-loopback-4.txt 4 $R/fit-loopback-4.csv
fi
for SHAPE in 2x2 2x1; do
  if [ ! -f $R/fit-$SHAPE-20mbit.csv ]; then
    N=${SHAPE%x*}; P=${SHAPE#*x}; SIZES=516272,1668608,3337216
    [ $P = 1 ] && SIZES=104448,516272,1668608   # what crosses between islands: a fraction of the gradient
    "$py" -m ddp_lab.tools.cluster up --name fit --hosts $N --rate 20mbit > /dev/null
    "$py" -m ddp_lab.tools.cluster run --name fit --nproc-per-host $P -- "$GAPPED" $SIZES 0.3 10 2>&1 | grep 'bytes' \
      | tee $R/link-$SHAPE-20mbit.txt
    "$py" -m ddp_lab.tools.cluster down --name fit > /dev/null
    "$py" $FIT $R/link-$SHAPE-20mbit.txt $((N * P)) $R/fit-$SHAPE-20mbit.csv
  fi
done
[ -f $R/2x2-20mbit/race.csv ] || $B --hosts 2 --nproc-per-host 2 --rate 20mbit --max-steps 480 --stop-at-target \
  --strategies "$RACE" --fit $R/fit-2x2-20mbit.csv --fit-across $R/fit-2x1-20mbit.csv \
  --loopback-fit $R/fit-loopback-4.csv --steps-from $R/loopback-4/race.csv --out $R/2x2-20mbit -- $G
[ -f $R/1x2/race.csv ] || $B --hosts 1 --nproc-per-host 2 --rate 20mbit --max-steps 480 --stop-at-target \
  --strategies ddp --out $R/1x2 -- $G
# 5. loopback-4-oracle/: eager with its proxy replaced by the true mean (oracle.patch, in a worktree of the code):
#    the control that isolates the proxy's error from eager's mechanism.
if [ ! -f $R/loopback-4-oracle/race.csv ]; then
  ROOT=$PWD PYABS=$(realpath -s "$py") WT=$(mktemp -d)
  git worktree add -f "$WT" fa495fc > /dev/null && git -C "$WT" apply "$ROOT/$R/loopback-4-oracle/oracle.patch"
  ln -sfn ../conf "$WT/ddp_lab/conf"   # (the package's configs, as the editable install maps them)
  (cd "$WT" && ORACLE=1 PYTHONPATH="$WT" "$PYABS" -m ddp_lab.tools.bench.time_to_accuracy --target-loss 2.7 \
    --epochs 1 --eval-every 24 --seeds 1,2,3 --ranks 4 --max-steps 168 --strategies "$ISL" \
    --out "$ROOT/$R/loopback-4-oracle" -- $G)
  "$PYABS" $R/loopback-4-oracle/at_step.py $R/loopback-4-oracle/runs/diloco* > $R/loopback-4-oracle/val_loss.txt
  rm -rf $R/loopback-4-oracle/runs   # (the runs themselves are not the record)
  git worktree remove --force "$WT"
fi
# 6. loopback-4-480/: blocking against eager islands over 480 steps (the gap's course past warm-up).
if [ ! -f $R/loopback-4-480/race.csv ]; then
  $py -m ddp_lab.tools.bench.time_to_accuracy --target-loss 2.7 --epochs 10 --eval-every 48 --seeds 1,2,3 --ranks 4 \
    --max-steps 480 --strategies "diloco:sync.islands=2:sync.compress=int4:sync.rounding=feedback,$ISL" \
    --out $R/loopback-4-480 -- $G
  "$py" $R/loopback-4-480/curves.py $R/loopback-4-480 > $R/loopback-4-480/val_loss.txt
  rm -rf $R/loopback-4-480/runs
fi
# 7. loopback-4-proxy/: eager's proxies against blocking, islands 2x2 on loopback (seeds 1-3): blocking/ (at
#    6bf7d19), own-share/ (each rank's own outer gradient / M, proxy.patch with PROXY=share, 168 steps) and
#    local-480/ (its own outer gradient, PROXY=own, 480 steps); local/ and 2x2-20mbit-local/ at ca41d01, where
#    the own outer gradient became eager's default proxy (sync.eager_proxy=local): no patch.
P=$R/loopback-4-proxy
AT="$py $R/loopback-4-oracle/at_step.py"
if [ ! -f $P/local/race.csv ]; then
  $B --ranks 4 --max-steps 168 --strategies "$ISL" --out $P/local -- $G
  $AT $P/local/runs/diloco* > $P/local/val_loss.txt && rm -rf $P/local/runs
fi
[ -f $P/2x2-20mbit-local/race.csv ] || $B --hosts 2 --nproc-per-host 2 --rate 20mbit --max-steps 480 --stop-at-target \
  --strategies "$ISL" --fit $R/fit-2x2-20mbit.csv --fit-across $R/fit-2x1-20mbit.csv \
  --loopback-fit $R/fit-loopback-4.csv --steps-from $P/local/race.csv --out $P/2x2-20mbit-local -- $G
# 8. loopback-4-proxy/interleaved/: DDP on one host of 2 ranks and islands (local proxy) on 2 hosts of 2 at
#    20 Mbit/s, alternating seed by seed (1x2-seedN, then 2x2-seedN), at ca41d01.
for s in 1 2 3; do
  [ -f $P/interleaved/1x2-seed$s/race.csv ] || $B --hosts 1 --nproc-per-host 2 --rate 20mbit --max-steps 480 \
    --stop-at-target --seeds $s --strategies ddp --out $P/interleaved/1x2-seed$s -- $G
  [ -f $P/interleaved/2x2-seed$s/race.csv ] || $B --hosts 2 --nproc-per-host 2 --rate 20mbit --max-steps 480 \
    --stop-at-target --seeds $s --strategies "$ISL" --out $P/interleaved/2x2-seed$s -- $G
done
find $R -name model.pt -delete   # the weights are not the record
