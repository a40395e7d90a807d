#!/bin/bash
# Where does DDP's step grow on a 100 Mbit/s link? LeNet (the defaults: lenet_fast, global batch
# 512), 2 ranks, 72 steps (the first 8 not timed), on loopback and across 2 emulated hosts at
# 100 Mbit/s, three times each, interleaved. Each rank measures every step its compute (the step's
# start to its last gradient) and its sync wait (then to the gradient sync's end), logged per rank
# every 8 steps (perf/compute_ms/rank<N>, perf/sync_wait_ms/rank<N>); summarize.py splits step_ms
# into them. Then the back-to-back all-reduce of LeNet's 516,272 bytes on the same link
# (gapped.py of the idle all-reduce record), to price the wire.
# From the repository root, as root:  [VENV=path/to/venv] bash docs/results/2026-11-28_zen4-2c_ddp-step-decomposed/run.sh
set -euo pipefail
R=docs/results/2026-11-28_zen4-2c_ddp-step-decomposed
py=${VENV:-.venv}/bin/python
out=${OUT:-$R/raw}
common="sync=ddp trainer.max_steps=72 trainer.warmup_steps=8 trainer.keep_ckpts=0 trainer.progress=false
  trainer.log_every=8 trainer.eval_every=0"
"$py" -m ddp_lab.cluster down --name dec 2>/dev/null || true
"$py" -m ddp_lab.cluster up --name dec --hosts 2 --rate 100mbit | tee $R/cluster.txt
for rep in 1 2 3; do
  "$py" -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train $common \
    hydra.run.dir=$out/lo-$rep > $out/lo-$rep.log 2>&1
  "$py" -m ddp_lab.cluster run --name dec -- -m ddp_lab.train $common hydra.run.dir=$out/h100-$rep \
    > $out/h100-$rep.log 2>&1
done
"$py" -m ddp_lab.cluster run --name dec -- docs/results/2026-11-28_xeon-2c_idle-all-reduce/gapped.py \
  516272 0,0.2 10 2>&1 | grep '^\[.*bytes\|^bytes' | tee $R/all_reduce.txt
"$py" -m ddp_lab.cluster down --name dec
"$py" $R/summarize.py $out | tee $R/table.md
