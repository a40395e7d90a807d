#!/bin/bash
# Where does the network dominate LeNet's DDP step at 4 hosts? The race's model and batch (the defaults:
# lenet_fast, global batch 512), 48 steps (the first 8 not timed), 4 ranks on loopback, then across 4
# emulated hosts at 10, 20 and 40 Mbit/s; step_ms from summary.json (probe.txt), and the fastest rate
# where DDP's step is at least 3x its loopback step (rate.txt). Run before run.sh, which races there.
# From the repository root, as root:  [VENV=path/to/venv] bash docs/results/2026-11-28_zen4-2c_race-lenet-4-hosts/probe.sh
set -euo pipefail
R=docs/results/2026-11-28_zen4-2c_race-lenet-4-hosts
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/probe.XXXX)
common="sync=ddp trainer.max_steps=48 trainer.warmup_steps=8 trainer.keep_ckpts=0 trainer.progress=false
  trainer.log_every=8 trainer.eval_every=0"
"$py" -m torch.distributed.run --standalone --nproc_per_node=4 -m ddp_lab.train $common hydra.run.dir=$out/lo \
  > $out/lo.log 2>&1
for r in 10mbit 20mbit 40mbit; do
  "$py" -m ddp_lab.cluster up --name probe --hosts 4 --rate $r > /dev/null
  "$py" -m ddp_lab.cluster run --name probe -- -m ddp_lab.train $common hydra.run.dir=$out/h$r > $out/h$r.log 2>&1
  "$py" -m ddp_lab.cluster down --name probe > /dev/null
done
"$py" - "$out" <<'PY' | tee $R/probe.txt
import json, sys
out = sys.argv[1]
lo = json.load(open(f"{out}/lo/summary.json"))["step_ms"]
best = None
for d in ("lo", "h10mbit", "h20mbit", "h40mbit"):
    s = json.load(open(f"{out}/{d}/summary.json"))
    print(d, "step_ms", round(s["step_ms"], 1), "x_loopback", round(s["step_ms"] / lo, 2),
          "wire_bytes_per_step", s["wire_bytes_per_step"], "collectives_per_step", s["collectives_per_step"])
    if d != "lo" and s["step_ms"] >= 3 * lo:
        best = d[1:]  # the last one listed is the fastest
print("rate", best)
PY
tail -1 $R/probe.txt | cut -d' ' -f2 > $R/rate.txt
