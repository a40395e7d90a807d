#!/bin/sh
# DiLoCo overlapped (sync.overlap=2) with its outer gradient sent whole (sync.fragments=1) or in 4
# staggered fragments (sync.fragments=4: a quarter every 2 steps), on 2 emulated hosts with 20 Mbit/s
# links, and DiLoCo that waits on loopback (2 ranks, torchrun --standalone) as the step without a slow
# link: the small GPT (model=gpt, 834k parameters, 3.3 MB of fp32 outer gradient) with AdamW,
# sync.every=8, 72 steps of which the first 8 are not timed, 3 repeats interleaved; step_ms, bytes and
# the validation loss from summary.json (runs.txt); summarize.py makes table.md.
# Usage (from the repository root, as root): [VENV=path/to/venv] sh docs/results/2026-11-28_zen4-2c_diloco-fragments/run.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/diloco-fragments.XXXX)
common="model=gpt data=text optim=adamw sync=diloco sync.every=8 trainer.max_steps=72 trainer.warmup_steps=8
  trainer.keep_ckpts=0 trainer.progress=false trainer.log_every=8"
summary() {  # summary.json, labels...
  "$py" - "$@" <<'PY' | tee -a "$here/runs.txt"
import json, sys
try:
    s = json.load(open(sys.argv[1]))
    print(*sys.argv[2:], "step_ms", round(s["step_ms"], 1), "wire_bytes_per_step", s["wire_bytes_per_step"],
          "collectives_per_step", s["collectives_per_step"], "val_loss", round(s["val_loss"], 6), "sync", s["sync"])
except FileNotFoundError:
    print(*sys.argv[2:], "no summary")
PY
}
: > "$here/runs.txt"
"$py" -m ddp_lab.cluster down --name frag 2>/dev/null
"$py" -m ddp_lab.cluster up --name frag --hosts 2 --rate 20mbit | tee "$here/cluster.txt"
for repeat in 1 2 3; do
  for f in 1 4; do
    "$py" -m ddp_lab.cluster run --name frag -- -m ddp_lab.train $common sync.overlap=2 sync.fragments=$f \
      hydra.run.dir="$out/hosts-f$f-$repeat" > "$here/hosts-f$f-$repeat.log" 2>&1
    summary "$out/hosts-f$f-$repeat/summary.json" hosts "overlap2-fragments$f" "$repeat"
  done
  "$py" -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train $common \
    hydra.run.dir="$out/loopback-$repeat" > "$here/loopback-$repeat.log" 2>&1
  summary "$out/loopback-$repeat/summary.json" loopback "overlap0-fragments1" "$repeat"
done
"$py" -m ddp_lab.cluster down --name frag
rm -rf "$out"
"$py" "$here/summarize.py" "$here" | tee "$here/table.md"
