#!/bin/sh
# The 403M-parameter GPT (32 blocks of 1024) with AdamW on 8 emulated hosts of 2,080 MiB
# (cluster up --mem, 10gbit links, one rank a host), 3 steps: stage 3, stage 3 with sync.overlap_reduce=false, fsdp, each with
# trainer.memory_check=false (the fit check's 15% margin refuses them: the stage3-peak record). Every host's cgroup
# peak and the ranks' summary.json peaks, appended to capped-runs.txt.
# Usage (from the repository root, as root): [VENV=.venv] [SYNCS="zero3 fsdp"] sh <this folder>/capped.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/capped.XXXX)
common="model=gpt2 model.n_layer=32 model.n_embd=1024 model.n_head=16 model.block_size=16 data=text
  data.val_fraction=0.0005 data.batch_size=40 optim=adamw trainer.max_steps=3 trainer.warmup_steps=1
  trainer.amp=off trainer.progress=false dist.timeout_s=600"
peaks() {  # every host's memory cgroup: its peak (max_usage_in_bytes), then reset for the next run
  for d in /sys/fs/cgroup/memory/ddplab/ddplab-s3cap-*; do
    printf '%s %s MiB; ' "$(basename "$d")" $(( $(cat "$d/memory.max_usage_in_bytes") / 1048576 ))
    echo 0 > "$d/memory.max_usage_in_bytes"
  done
}
"$py" -m ddp_lab.tools.cluster down --name s3cap > /dev/null 2>&1
"$py" -m ddp_lab.tools.cluster up --name s3cap --hosts 8 --rate 10gbit --mem 2080m > "$out/cluster.txt"
for s in ${SYNCS:-zero3 zero3-wait fsdp}; do
  case $s in zero3) sync="sync=zero sync.zero_stage=3";; zero3-wait) sync="sync=zero sync.zero_stage=3 sync.overlap_reduce=false";; *) sync="sync=fsdp";; esac
  sync="$sync trainer.memory_check=false"
  start=$(date +%s)
  "$py" -m ddp_lab.tools.cluster run --name s3cap --hosts 8 --grace-s 60 -- -m ddp_lab.train $common $sync \
    hydra.run.dir="$out/$s" > "$out/$s.log" 2>&1
  rc=$?
  echo "$s at $(git rev-parse --short HEAD) rc $rc $(( $(date +%s) - start )) s; cgroup peaks: $(peaks)" \
    | tee -a "$here/capped-runs.txt"
  grep -h "memory estimate\|ms/step\|error\|killed\|limit" "$out/$s.log" | head -12 | sed "s|^|  $s: |" \
    | tee -a "$here/capped-runs.txt"
  "$py" - "$out/$s/summary.json" <<'PY' | tee -a "$here/capped-runs.txt"
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except FileNotFoundError:
    print("  no summary")
    raise SystemExit
print("  summary:", {k: s[k] for k in ("steps", "train_loss", "val_loss", "peak_mem_mb_by_rank",
                                      "predicted_peak_mb_by_rank")})
PY
done
"$py" -m ddp_lab.tools.cluster down --name s3cap
rm -rf "$out"
