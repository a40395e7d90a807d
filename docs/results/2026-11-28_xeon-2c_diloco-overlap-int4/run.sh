#!/bin/sh
# DiLoCo's outer sync in 4 bits, blocking (overlap 0) and overlapped with 4 inner steps (overlap 4),
# against fp32 overlapped, on 2 emulated hosts with 10 Mbit/s links, and DiLoCo in 4 bits on loopback
# (2 ranks, torchrun --standalone) as the time without a slow link: the small GPT (model=gpt, 834k
# parameters) with AdamW, sync.every=8, 72 steps of which the first 8 are not timed, 3 repeats
# interleaved; step_ms from summary.json.
# Usage (from the repository root, as root): [VENV=path/to/venv] sh docs/results/2026-11-28_xeon-2c_diloco-overlap-int4/run.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/diloco-overlap-int4.XXXX)
common="model=gpt data=text optim=adamw sync=diloco sync.every=8 trainer.max_steps=72 trainer.warmup_steps=8
  trainer.keep_ckpts=0 trainer.progress=false trainer.log_every=8"
summary() {  # summary.json, labels...
  "$py" - "$@" <<'PY' | tee -a "$here/runs.txt"
import json, sys
try:
    s = json.load(open(sys.argv[1]))
    print(*sys.argv[2:], "step_ms", round(s["step_ms"], 1), "wire_bytes_per_step", s["wire_bytes_per_step"],
          "val_loss", round(s["val_loss"], 6), "sync", s["sync"])
except FileNotFoundError:
    print(*sys.argv[2:], "no summary")
PY
}
: > "$here/runs.txt"
"$py" -m ddp_lab.cluster up --name late4 --hosts 2 --rate 10mbit | tee "$here/cluster.txt"
for repeat in 1 2 3; do
  for s in int4-overlap0:int4:0 int4-overlap4:int4:4 fp32-overlap4:none:4; do
    name=${s%%:*}; rest=${s#*:}; compress=${rest%%:*}; overlap=${rest#*:}
    "$py" -m ddp_lab.cluster run --name late4 -- -m ddp_lab.train $common sync.compress=$compress \
      sync.overlap=$overlap hydra.run.dir="$out/hosts-$name-$repeat" > "$here/hosts-$name-$repeat.log" 2>&1
    summary "$out/hosts-$name-$repeat/summary.json" hosts "$name" "$repeat"
  done
  "$py" -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train $common sync.compress=int4 \
    hydra.run.dir="$out/loopback-$repeat" > "$here/loopback-$repeat.log" 2>&1
  summary "$out/loopback-$repeat/summary.json" loopback int4-overlap0 "$repeat"
done
"$py" -m ddp_lab.cluster down --name late4
rm -rf "$out"
