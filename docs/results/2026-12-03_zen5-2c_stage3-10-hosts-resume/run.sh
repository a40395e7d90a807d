#!/bin/sh
# The issue's last memory row: the 403M-parameter GPT (32 blocks of 1024) under ZeRO stage 3 with AdamW, trained
# 2 steps on 8 emulated hosts of 2,080 MiB (one rank a host, 10 Gbit/s, a memory cgroup each), saved at step 2,
# then the same run directory resumed on 10 such hosts (trainer.resume=auto: the checkpoint resharded from 8 to 10
# ranks) for a third step. trainer.memory_check=false, as in 2026-12-02_zen5-2c_stage3-peak: the check's 15%
# margin refuses the 8-host launch. Every host's cgroup peak and the ranks' summary.json, appended to runs.txt.
# Usage (from the repository root, as root): [VENV=.venv] sh <this folder>/run.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/s3ten.XXXX)
common="model=gpt2 model.n_layer=32 model.n_embd=1024 model.n_head=16 model.block_size=16 data=text
  data.val_fraction=0.0005 data.batch_size=40 optim=adamw trainer.warmup_steps=1 trainer.amp=off
  trainer.progress=false dist.timeout_s=600 sync=zero sync.zero_stage=3 trainer.memory_check=false
  trainer.ckpt_every_steps=2 hydra.run.dir=$out/run"
peaks() {  # every host's memory cgroup: its peak (max_usage_in_bytes), then reset for the next launch
  for d in /sys/fs/cgroup/memory/ddplab/ddplab-s3ten-*; do
    printf '%s %s MiB; ' "$(basename "$d")" $(( $(cat "$d/memory.max_usage_in_bytes") / 1048576 ))
    echo 0 > "$d/memory.max_usage_in_bytes"
  done
}
summary() {
  "$py" - "$out/run/summary.json" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except FileNotFoundError:
    print("  no summary")
    raise SystemExit
print("  summary:", {k: s.get(k) for k in ("steps", "train_loss", "val_loss", "peak_mem_mb_by_rank",
                                          "predicted_peak_mb_by_rank", "build_peak_mb_by_rank", "step_ms")})
PY
}
launch() {  # label hosts overrides...
  label=$1 hosts=$2; shift 2
  start=$(date +%s)
  "$py" -m ddp_lab.tools.cluster run --name s3ten --hosts "$hosts" --grace-s 60 -- -m ddp_lab.train $common "$@" \
    > "$out/$label.log" 2>&1
  rc=$?
  echo "$label at $(git rev-parse --short HEAD): $hosts hosts, rc $rc, $(( $(date +%s) - start )) s; cgroup peaks: $(peaks)" \
    | tee -a "$here/runs.txt"
  grep -h "memory estimate\|resumed\|ms/step\|step [0-9]*/\|error\|killed\|limit\|checkpoint" "$out/$label.log" \
    | head -20 | sed "s|^|  $label: |" | tee -a "$here/runs.txt"
  summary | tee -a "$here/runs.txt"
  cp "$out/$label.log" "$here/$label.log"  # (cut from the record after 84f02ca: docs/ kept small)
}
"$py" -m ddp_lab.tools.cluster down --name s3ten > /dev/null 2>&1
"$py" -m ddp_lab.tools.cluster up --name s3ten --hosts 10 --rate 10gbit --mem 2080m > "$here/cluster.txt"
: > "$here/runs.txt"
launch train-8-hosts 8 trainer.max_steps=2
du -sh "$out/run"/checkpoints/* 2>/dev/null | sed 's|^|  checkpoint: |' | tee -a "$here/runs.txt"
launch resume-10-hosts 10 trainer.max_steps=3 trainer.resume=auto
"$py" -m ddp_lab.tools.cluster down --name s3ten
rm -rf "$out"
