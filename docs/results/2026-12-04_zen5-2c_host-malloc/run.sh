#!/bin/sh
# trainer.host_malloc under stage 3 and fsdp (auto: lean there; glibc; reuse), DDP beside them: 2 emulated hosts
# at 1 Gbit/s, one rank each, gpt_small with AdamW, 12 steps (the first 4 not timed), 3 repeats, the 7 runs interleaved.
# As root, from the repository root: sh docs/results/2026-12-04_zen5-2c_host-malloc/run.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/host-malloc.XXXX)
head -c 300000 /usr/share/games/fortunes/fortunes > "$out/corpus.txt"
common="model=gpt_small data=text data.path=$out/corpus.txt data.val_fraction=0.05 data.batch_size=8 optim=adamw
  trainer.max_steps=12 trainer.warmup_steps=4 trainer.keep_ckpts=0 trainer.compile=false trainer.amp=off
  trainer.progress=false trainer.log_every=4"
runs="ddp:sync=ddp:auto zero3:sync=zero,sync.zero_stage=3:auto zero3:sync=zero,sync.zero_stage=3:glibc
  zero3:sync=zero,sync.zero_stage=3:reuse fsdp:sync=fsdp:auto fsdp:sync=fsdp:glibc fsdp:sync=fsdp:reuse"
: > "$here/runs.txt"
"$py" -m ddp_lab.tools.cluster up --name hm --hosts 2 --rate 1gbit > "$here/cluster.txt"
for repeat in 1 2 3; do
  for s in $runs; do
    name=${s%%:*}; malloc=${s##*:}; overrides=$(echo "$s" | cut -d: -f2 | tr , ' ')
    "$py" -m ddp_lab.tools.cluster run --name hm -- -m ddp_lab.train $common $overrides \
      trainer.host_malloc=$malloc hydra.run.dir="$out/$name-$malloc-$repeat" > "$out/$name-$malloc-$repeat.log" 2>&1
    "$py" - "$out/$name-$malloc-$repeat/summary.json" "$name" "$malloc" "$repeat" <<'PY' | tee -a "$here/runs.txt"
import json, sys
try:
    s = json.load(open(sys.argv[1]))
    print(*sys.argv[2:], "step_ms", round(s["step_ms"], 1), "peak_mb_by_rank", [round(m) for m in s["peak_mem_mb_by_rank"]],
          "predicted_mb_by_rank", s["predicted_peak_mb_by_rank"], "val_loss", s["val_loss"])
except FileNotFoundError:
    print(*sys.argv[2:], "no summary")
PY
  done
done
"$py" -m ddp_lab.tools.cluster down --name hm > /dev/null
rm -rf "$out"
