#!/bin/sh
# Which collectives should sync.mode=zero use by default? Step time of ZeRO stage 3 on
# torch's collectives (builtin) and on the direct ones (sync.algo=direct), on a second kind of CPU:
# step.sh with stage 3's two runs in place of the others (DDP's step: step/runs.txt). 2 emulated
# hosts (1gbit links, one rank a host), model=gpt_small with AdamW, 12 steps (the first 4 not timed),
# 3 repeats interleaved. As root, from the repository root:
#   [VENV=path/to/venv] sh docs/results/2026-11-29_zen4-2c_zero-default-algo/step3.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/zero-default.XXXX)
head -c 300000 /usr/share/games/fortunes/fortunes > "$out/corpus.txt"
common="model=gpt_small data=text data.path=$out/corpus.txt data.val_fraction=0.05 data.batch_size=8 optim=adamw
  trainer.max_steps=12 trainer.warmup_steps=4 trainer.keep_ckpts=0 trainer.compile=false trainer.amp=off
  trainer.progress=false trainer.log_every=4"
zero="sync=zero,sync.zero_stage"
runs="zero3:$zero=3,sync.algo=builtin zero3-direct:$zero=3,sync.algo=direct"
mkdir -p "$here/step3"
: > "$here/step3/runs.txt"
"$py" -m ddp_lab.tools.cluster up --name zd --hosts 2 --rate 1gbit | tee "$here/step3/cluster.txt"
for repeat in 1 2 3; do
  for s in $runs; do
    name=${s%%:*}; overrides=$(echo "${s#*:}" | tr , ' ')
    "$py" -m ddp_lab.tools.cluster run --name zd -- -m ddp_lab.train $common $overrides \
      hydra.run.dir="$out/$name-$repeat" > "$here/step3/$name-$repeat.log" 2>&1
    "$py" - "$out/$name-$repeat/summary.json" "$name" "$repeat" <<'PY' | tee -a "$here/step3/runs.txt"
import json, sys
try:
    s = json.load(open(sys.argv[1]))
    print(*sys.argv[2:], "step_ms", round(s["step_ms"], 1), "comm_ms_per_step", s.get("comm_ms_per_step"),
          "wire_bytes_per_step", s["wire_bytes_per_step"], "val_loss", s["val_loss"], "sync", s["sync"])
except FileNotFoundError:
    print(*sys.argv[2:], "no summary")
PY
  done
done
"$py" -m ddp_lab.tools.cluster down --name zd
rm -rf "$out"
