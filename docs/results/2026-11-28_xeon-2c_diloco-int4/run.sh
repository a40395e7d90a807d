#!/bin/sh
# DiLoCo's outer gradients in fp32, 8 and 4 bits (sync.compress=none|int8|int4) on the small GPT
# (model=gpt, 834k parameters) with AdamW inside, on Debian's fortunes: 2 ranks on loopback,
# 200 steps, sync.every=8 (25 synchronisations), seeds 1-3, the three interleaved (seed 1 of
# each, then seed 2...). The held-out loss at the end and the bytes per step, from summary.json.
# Usage (from the repository root): [VENV=path/to/venv] sh docs/results/2026-11-28_xeon-2c_diloco-int4/run.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/diloco-int4.XXXX)
common="model=gpt data=text optim=adamw sync=diloco trainer.max_steps=200 trainer.keep_ckpts=0
  trainer.progress=false trainer.log_every=40"
: > "$here/runs.txt"
for seed in 1 2 3; do
  for compress in none int8 int4; do
    "$py" -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train $common seed=$seed \
      sync.compress=$compress hydra.run.dir="$out/$compress-$seed" > "$here/$compress-$seed.log" 2>&1
    "$py" - "$out/$compress-$seed/summary.json" "$compress" "$seed" <<'PY' | tee -a "$here/runs.txt"
import json, sys
s = json.load(open(sys.argv[1]))
print(sys.argv[2], sys.argv[3], "val_loss", round(s["val_loss"], 6), "wire_bytes_per_step", s["wire_bytes_per_step"],
      "step_ms", round(s["step_ms"], 1), "steps", s.get("steps"), "sync", s["sync"])
PY
  done
done
rm -rf "$out"
