#!/bin/sh
# The memory wall on 8 emulated hosts of LIMIT each (cluster up --mem, 10gbit links, one rank a host):
# a 32-block GPT of 1024 (403M parameters: 1.61 GB of fp32 weights, 4.8 GB of model state with SGD's
# momentum) does not fit one host whole; DDP and ZeRO stages 1 and 2 are refused before the first step.
# Stage 3 and fsdp build it a unit at a time, train 3 steps writing a sharded checkpoint each step,
# have rank 3 SIGKILLed after step 2 (torchrun restarts, resumes from the shards), then resume again
# on 7 hosts (resharded) for a 4th step. Every host's peak is read from its memory cgroup.
# Usage (from the repository root, as root): [VENV=path/to/venv] [LIMIT=2.0g] [SYNCS="zero3 fsdp"]
#   [REFUSALS=yes] sh <this folder>/run.sh  (SYNCS, REFUSALS=no: run part of it again; runs.txt is appended to)
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
limit=${LIMIT:-2.0g}
out=${OUT:-/tmp/wall}
mkdir -p "$out"
common="model=gpt2 model.n_layer=32 model.n_embd=1024 model.n_head=16 model.block_size=16 data=text
  data.val_fraction=0.0005 data.batch_size=56 optim=sgd trainer.warmup_steps=1 trainer.amp=off
  trainer.progress=false trainer.ckpt_every=1 trainer.keep_ckpts=2 dist.timeout_s=600"
peaks() {  # every host's memory cgroup: its peak (max_usage_in_bytes), then reset for the next run
  for d in /sys/fs/cgroup/memory/ddplab/ddplab-wall-*; do
    printf '%s %s MiB; ' "$(basename "$d")" $(( $(cat "$d/memory.max_usage_in_bytes") / 1048576 ))
    echo 0 > "$d/memory.max_usage_in_bytes"
  done
}
run() {  # name, VAR=value for the environment (or -), hosts, max-restarts, overrides...
  name=$1; envs=$2; hosts=$3; restarts=$4; shift 4
  [ "$envs" = - ] && envs=
  start=$(date +%s)
  env $envs "$py" -m ddp_lab.tools.cluster run --name wall --hosts "$hosts" --max-restarts "$restarts" \
    --grace-s 60 -- -m ddp_lab.train $common "$@" >> "$here/$name.log" 2>&1
  rc=$?
  echo "$name rc $rc $(( $(date +%s) - start )) s hosts $hosts; cgroup peaks: $(peaks)" | tee -a "$here/runs.txt"
}
summary() {  # the run's summary.json (its last launch's)
  "$py" - "$1/summary.json" <<'PY' | tee -a "$here/runs.txt"
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except FileNotFoundError:
    print("  no summary")
    raise SystemExit
print("  summary:", {k: s[k] for k in ("steps", "world_sizes", "train_loss", "val_loss", "model_state_bytes",
                                      "peak_mem_mb_by_rank", "predicted_peak_mb_by_rank")})
PY
}
"$py" -m ddp_lab.tools.cluster down --name wall > /dev/null 2>&1
"$py" -m ddp_lab.tools.cluster up --name wall --hosts 8 --rate 10gbit --mem "$limit" | tee "$here/cluster.txt"
if [ "${REFUSALS:-yes}" = yes ]; then
  run ddp - 8 0 sync=ddp trainer.max_steps=3 hydra.run.dir="$out/ddp"
  run zero1 - 8 0 sync=zero sync.zero_stage=1 trainer.max_steps=3 hydra.run.dir="$out/zero1"
  run zero2 - 8 0 sync=zero sync.zero_stage=2 trainer.max_steps=3 hydra.run.dir="$out/zero2"
fi
for s in ${SYNCS:-zero3 fsdp}; do
  rm -rf "$out/$s"
  echo "$s at $(git rev-parse --short HEAD)" >> "$here/runs.txt"
  [ $s = zero3 ] && sync="sync=zero sync.zero_stage=3" || sync="sync=fsdp"
  run $s DDP_LAB_FAULT=rank=3,step=2,kind=kill 8 1 $sync trainer.max_steps=3 hydra.run.dir="$out/$s"
  summary "$out/$s"
  run $s-resharded-7 - 7 0 $sync trainer.max_steps=4 trainer.resume=auto hydra.run.dir="$out/$s"
  summary "$out/$s"
done
"$py" -m ddp_lab.tools.cluster down --name wall
