#!/bin/sh
# Predicted against measured peak memory of every rank: DDP, ZeRO stages 1-3 and fsdp at 2, 4 and 8 ranks
# on one machine (torchrun, loopback), MODEL (gpt_small or gpt2) with AdamW, global batch 8, 3 steps with a
# checkpoint at step 2, an evaluation and model.pt: a rank's whole life. Each run's summary.json gives both.
# Usage (from the repository root): [VENV=path/to/venv] [MODEL=gpt_small] sh <this folder>/run.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/peak.XXXX)
model=${MODEL:-gpt_small}
common="model=$model model.block_size=128 data=text data.val_fraction=0.002 data.batch_size=8 optim=adamw trainer.max_steps=3
  trainer.warmup_steps=1 trainer.ckpt_every=2 trainer.keep_ckpts=1 trainer.amp=off trainer.progress=false"
: > "$here/runs-$model.txt"
for n in 2 4 8; do
  for s in ddp:sync=ddp zero1:sync=zero zero2:sync=zero,sync.zero_stage=2 zero3:sync=zero,sync.zero_stage=3 \
           fsdp:sync=fsdp; do
    name=${s%%:*}; overrides=$(echo "${s#*:}" | tr , ' ')
    "$py" -m ddp_lab.distributed.torchrun --standalone --nproc_per_node=$n -m ddp_lab.train $common $overrides \
      hydra.run.dir="$out/$name-$n" > "$here/$model-$name-$n.log" 2>&1
    "$py" - "$out/$name-$n/summary.json" "$name" "$n" <<'PY' | tee -a "$here/runs-$model.txt"
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except FileNotFoundError:
    print(*sys.argv[2:], "no summary")
    raise SystemExit
m, p = s["peak_mem_mb_by_rank"], s["predicted_peak_mb_by_rank"]
print(*sys.argv[2:], "measured", [round(x) for x in m], "predicted", [round(x) for x in p],
      "ratio", f"{min(a / b for a, b in zip(m, p)):.2f}-{max(a / b for a, b in zip(m, p)):.2f}")
PY
  done
done
rm -rf "$out"
