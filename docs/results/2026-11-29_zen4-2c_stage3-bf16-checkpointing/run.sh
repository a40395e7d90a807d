#!/bin/sh
# Stage 3's wire bytes, peak memory per rank and step time: fp32 weights against bf16 weights (fp32 master),
# with and without activation checkpointing, and the control (bf16 autocast over fp32 gathers). gpt2 at a
# 512-token context, AdamW, global batch 8 on 2 ranks, 4 steps (3 timed), an evaluation and model.pt: a
# rank's whole life. Three rounds, the configurations interleaved within each.
# Usage (from the repository root): [VENV=path/to/venv] sh <this folder>/run.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/mp.XXXX)
common="model=gpt2 model.block_size=512 data=text data.val_fraction=0.002 data.batch_size=8 optim=adamw
  trainer.max_steps=4 trainer.warmup_steps=1 trainer.progress=false sync=zero sync.zero_stage=3"
: > "$here/runs.txt"
for round in 1 2 3; do
  for c in fp32:trainer.amp=off fp32-ac:trainer.amp=off,trainer.activation_checkpointing=units \
           control:trainer.amp=bf16,sync.param_dtype=fp32 bf16:trainer.amp=bf16 \
           bf16-ac:trainer.amp=bf16,trainer.activation_checkpointing=units; do
    name=${c%%:*}; overrides=$(echo "${c#*:}" | tr , ' ')
    "$py" -m ddp_lab.distributed.torchrun --standalone --nproc_per_node=2 -m ddp_lab.train $common $overrides \
      hydra.run.dir="$out/$name-$round" > "$here/$name-$round.log" 2>&1
    "$py" - "$out/$name-$round/summary.json" "$name" "$round" <<'PY' | tee -a "$here/runs.txt"
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except FileNotFoundError:
    print(*sys.argv[2:], "no summary")
    raise SystemExit
print(*sys.argv[2:], "peak_mb", [round(x) for x in s["peak_mem_mb_by_rank"]], "predicted_mb",
      [round(x) for x in s["predicted_peak_mb_by_rank"]], "wire_bytes_per_step", int(s["wire_bytes_per_step"]),
      "step_ms", round(s["step_ms"]), "val_loss", round(s["val_loss"], 4))
PY
  done
done
rm -rf "$out"
