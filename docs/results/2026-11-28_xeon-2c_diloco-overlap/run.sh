#!/bin/sh
# DiLoCo's outer all-reduce overlapped with the inner steps (sync.overlap=4) against DiLoCo that waits
# for it (overlap 0), on 2 emulated hosts with 50 Mbit/s links, and DiLoCo on loopback (2 ranks,
# torchrun --standalone) as the time without a slow link: the small GPT (model=gpt, 834k
# parameters, 3.3 MB of outer gradient) with AdamW, sync.every=8, 72 steps of which the first 8
# are not timed (8 synchronisations timed), 3 repeats interleaved; step_ms from summary.json.
# Usage (from the repository root, as root): [VENV=path/to/venv] sh docs/results/2026-11-28_xeon-2c_diloco-overlap/run.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/diloco-overlap.XXXX)
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
"$py" -m ddp_lab.cluster up --name late --hosts 2 --rate 50mbit | tee "$here/cluster.txt"
for repeat in 1 2 3; do
  for overlap in 0 4; do
    "$py" -m ddp_lab.cluster run --name late -- -m ddp_lab.train $common sync.overlap=$overlap \
      hydra.run.dir="$out/hosts-overlap$overlap-$repeat" > "$here/hosts-overlap$overlap-$repeat.log" 2>&1
    summary "$out/hosts-overlap$overlap-$repeat/summary.json" hosts "overlap$overlap" "$repeat"
  done
  "$py" -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train $common \
    hydra.run.dir="$out/loopback-$repeat" > "$here/loopback-$repeat.log" 2>&1
  summary "$out/loopback-$repeat/summary.json" loopback overlap0 "$repeat"
done
"$py" -m ddp_lab.cluster down --name late
rm -rf "$out"
