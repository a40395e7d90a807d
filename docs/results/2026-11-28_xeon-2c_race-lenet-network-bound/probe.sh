#!/bin/bash
# Where does the network dominate LeNet's DDP step? The race's model and batch (the defaults: lenet_fast,
# global batch 512), 48 steps (the first 8 not timed), 2 ranks on loopback, then across 2 emulated hosts
# at 10, 20 and 40 Mbit/s; step_ms from summary.json (probe.txt). Run before run.sh, to choose its rate.
# From the repository root, as root:  [VENV=path/to/venv] bash docs/results/2026-11-28_xeon-2c_race-lenet-network-bound/probe.sh
set -euo pipefail
R=docs/results/2026-11-28_xeon-2c_race-lenet-network-bound
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/probe.XXXX)
common="sync=ddp trainer.max_steps=48 trainer.warmup_steps=8 trainer.keep_ckpts=0 trainer.progress=false
  trainer.log_every=8 trainer.eval_every=0"
"$py" -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train $common hydra.run.dir=$out/lo \
  > $out/lo.log 2>&1
for r in 10mbit 20mbit 40mbit; do
  "$py" -m ddp_lab.cluster up --name probe --hosts 2 --rate $r
  "$py" -m ddp_lab.cluster run --name probe -- -m ddp_lab.train $common hydra.run.dir=$out/h$r > $out/h$r.log 2>&1
  "$py" -m ddp_lab.cluster down --name probe
done
for d in lo h10mbit h20mbit h40mbit; do
  "$py" -c "import json, sys; s = json.load(open(sys.argv[1])); print(sys.argv[2], 'step_ms', s['step_ms'],
    'wire_bytes_per_step', s['wire_bytes_per_step'], 'collectives_per_step', s['collectives_per_step'])" \
    $out/$d/summary.json $d
done | tee $R/probe.txt
