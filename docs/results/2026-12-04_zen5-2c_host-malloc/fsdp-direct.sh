#!/bin/sh
# sync=fsdp's gradient reduce-scatter, torch's on gloo (an all-reduce of the whole buffer) against ddp_lab's
# direct one (sync.algo=direct), DDP beside them: 2 emulated hosts at 1 Gbit/s, one rank each, gpt_small with
# AdamW, 12 steps (the first 4 not timed), trainer.host_malloc=glibc (fsdp's faster regime there), 3 repeats,
# the 3 runs interleaved. As root, from the repository root: sh docs/results/2026-12-04_zen5-2c_host-malloc/fsdp-direct.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/fsdp-direct.XXXX)
head -c 300000 /usr/share/games/fortunes/fortunes > "$out/corpus.txt"
common="model=gpt_small data=text data.path=$out/corpus.txt data.val_fraction=0.05 data.batch_size=8 optim=adamw
  trainer.max_steps=12 trainer.warmup_steps=4 trainer.keep_ckpts=0 trainer.compile=false trainer.amp=off
  trainer.progress=false trainer.log_every=4 trainer.host_malloc=glibc"
runs="ddp:sync=ddp fsdp-builtin:sync=fsdp,sync.algo=builtin fsdp-direct:sync=fsdp,sync.algo=direct"
: > "$here/fsdp-direct.txt"
"$py" -m ddp_lab.tools.cluster up --name fd --hosts 2 --rate 1gbit > /dev/null  # (as cluster.txt)
for repeat in 1 2 3; do
  for s in $runs; do
    name=${s%%:*}; overrides=$(echo "${s#*:}" | tr , ' ')
    "$py" -m ddp_lab.tools.cluster run --name fd -- -m ddp_lab.train $common $overrides \
      hydra.run.dir="$out/$name-$repeat" > "$out/$name-$repeat.log" 2>&1
    "$py" - "$out/$name-$repeat/summary.json" "$name" "$repeat" <<'PY' | tee -a "$here/fsdp-direct.txt"
import json, sys
try:
    s = json.load(open(sys.argv[1]))
    print(*sys.argv[2:], "step_ms", round(s["step_ms"], 1), "wire_bytes_per_step", s["wire_bytes_per_step"],
          "peak_mb_by_rank", [round(m) for m in s["peak_mem_mb_by_rank"]], "val_loss", s["val_loss"], "sync", s["sync"])
except FileNotFoundError:
    print(*sys.argv[2:], "no summary")
PY
  done
done
"$py" -m ddp_lab.tools.cluster down --name fd > /dev/null
rm -rf "$out"
