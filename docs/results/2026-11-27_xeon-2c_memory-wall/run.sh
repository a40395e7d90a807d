#!/bin/sh
# The memory wall on 2 emulated hosts of LIMIT each (cluster up --mem, 2gbit links, one rank a
# host): model=gpt2 (86M parameters) with AdamW, 3 steps, batch 2 a rank, under DDP, ZeRO
# stage 3 and FSDP2; then DDP on the same hosts without a limit, for the loss to match.
# Stage 3 and FSDP2 also run with glibc's mmap threshold fixed at 1 MiB, so that the memory
# their gathers free goes back to the kernel (the zero-stages-memory record's finding).
# Usage (from the repository root, as root): [VENV=path/to/venv] [LIMIT=2.4g] sh docs/results/2026-11-27_xeon-2c_memory-wall/run.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
limit=${LIMIT:-2.4g}
out=$(mktemp -d /tmp/memory-wall.XXXX)
head -c 300000 /usr/share/games/fortunes/fortunes > "$out/corpus.txt"
: > "$here/runs.txt"
common="model=gpt2 data=text data.path=$out/corpus.txt data.val_fraction=0.1 data.batch_size=2 optim=adamw
  trainer.max_steps=3 trainer.warmup_steps=1 trainer.keep_ckpts=0 trainer.compile=false trainer.amp=off
  trainer.progress=false dist.timeout_s=120"
run() {  # name, VAR=value for the environment (or - for none), overrides...
  name=$1; envs=$2; shift 2
  [ "$envs" = - ] && envs=
  env $envs "$py" -m ddp_lab.cluster run --name wall --grace-s 30 -- -m ddp_lab.train $common \
    hydra.run.dir="$out/$name" "$@" > "$here/$name.log" 2>&1
  rc=$?
  "$py" - "$out/$name/summary.json" "$name" "$rc" <<'PY' | tee -a "$here/runs.txt"
import json, sys
path, name, rc = sys.argv[1:]
try:
    s = json.load(open(path))
    print(name, "rc", rc, "val_loss", s["val_loss"], "model_state_bytes", s["model_state_bytes"],
          "peak_mem_mb_by_rank", s["peak_mem_mb_by_rank"], "sync", s["sync"])
except FileNotFoundError:
    print(name, "rc", rc, "no summary")
PY
}
"$py" -m ddp_lab.cluster up --name wall --hosts 2 --rate 2gbit --mem "$limit" | tee "$here/cluster.txt"
run ddp-checked - sync=ddp
run ddp - sync=ddp trainer.memory_check=false
run zero3 MALLOC_MMAP_THRESHOLD_=1048576 sync=zero sync.zero_stage=3
run zero3-glibc-default - sync=zero sync.zero_stage=3
run fsdp MALLOC_MMAP_THRESHOLD_=1048576 sync=fsdp
"$py" -m ddp_lab.cluster down --name wall
"$py" -m ddp_lab.cluster up --name wall --hosts 2 --rate 2gbit | tee -a "$here/cluster.txt"
run ddp-no-limit - sync=ddp
"$py" -m ddp_lab.cluster down --name wall
rm -rf "$out"
