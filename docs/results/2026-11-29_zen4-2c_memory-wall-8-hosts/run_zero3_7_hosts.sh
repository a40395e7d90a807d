#!/bin/sh
# Stage 3's resume on 7 hosts, after run.sh: at 2.0 GiB a host the memory check refuses it (its estimate:
# 1.22 GiB to add where 1.2 GiB is left), so the hosts get LIMIT7 (2.2 GiB) and the run that run.sh left
# in $OUT/zero3 (8 hosts, step 3) resumes there for step 4, resharded 8 -> 7.
# Usage (from the repository root, as root): [VENV=path/to/venv] [LIMIT7=2.2g] sh <this folder>/run_zero3_7_hosts.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=${OUT:-/tmp/wall}
common="model=gpt2 model.n_layer=32 model.n_embd=1024 model.n_head=16 model.block_size=16 data=text
  data.val_fraction=0.0005 data.batch_size=56 optim=sgd trainer.warmup_steps=1 trainer.amp=off
  trainer.progress=false trainer.ckpt_every=1 trainer.keep_ckpts=2 dist.timeout_s=600"
"$py" -m ddp_lab.tools.cluster down --name wall > /dev/null 2>&1
"$py" -m ddp_lab.tools.cluster up --name wall --hosts 8 --rate 10gbit --mem "${LIMIT7:-2.2g}" | tee "$here/cluster-7-hosts.txt"
start=$(date +%s)
"$py" -m ddp_lab.tools.cluster run --name wall --hosts 7 --grace-s 60 -- -m ddp_lab.train $common \
  sync=zero sync.zero_stage=3 trainer.max_steps=4 trainer.resume=auto hydra.run.dir="$out/zero3" \
  > "$here/zero3-resharded-7-at-2.2g.log" 2>&1
echo "zero3-resharded-7 at ${LIMIT7:-2.2g} rc $? $(( $(date +%s) - start )) s" | tee -a "$here/runs.txt"
"$py" - "$out/zero3/summary.json" <<'PY' | tee -a "$here/runs.txt"
import json, sys
s = json.load(open(sys.argv[1]))
print("  summary:", {k: s[k] for k in ("steps", "world_sizes", "train_loss", "val_loss", "model_state_bytes",
                                      "peak_mem_mb_by_rank", "predicted_peak_mb_by_rank")})
PY
"$py" -m ddp_lab.tools.cluster down --name wall
