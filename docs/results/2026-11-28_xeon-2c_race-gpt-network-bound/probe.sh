#!/bin/bash
# Where does the network dominate? DDP's step for the small GPT (24 steps, the first 4 not timed) on
# 2 ranks on loopback, then across 2 emulated hosts at 20 and 40 Mbit/s; step_ms from summary.json
# (probe.txt). Run before run.sh, to choose its 2-host rate. From the repository root, as root:
#   [VENV=path/to/venv] bash docs/results/2026-11-28_xeon-2c_race-gpt-network-bound/probe.sh
set -euo pipefail
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/probe.XXXX)
common="model=gpt data=text optim=adamw sync=ddp trainer.max_steps=24 trainer.warmup_steps=4 trainer.keep_ckpts=0
  trainer.progress=false trainer.log_every=4 trainer.eval_every=0"
"$py" -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train $common hydra.run.dir=$out/lo \
  > $out/lo.log 2>&1
for r in 20mbit 40mbit; do
  "$py" -m ddp_lab.cluster up --name probe --hosts 2 --rate $r
  "$py" -m ddp_lab.cluster run --name probe -- -m ddp_lab.train $common hydra.run.dir=$out/h$r > $out/h$r.log 2>&1
  "$py" -m ddp_lab.cluster down --name probe
done
for d in lo h20mbit h40mbit; do
  "$py" -c "import json, sys; s = json.load(open(sys.argv[1])); print(sys.argv[2], 'step_ms', s['step_ms'],
    'wire_bytes_per_step', s['wire_bytes_per_step'])" $out/$d/summary.json $d
done
