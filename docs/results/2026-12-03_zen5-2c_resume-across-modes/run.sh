#!/bin/sh
# A resume under another sync mode, every rank's measured peak: gpt2 with AdamW written by ddp at 2 ranks (step 2),
# resumed at 4 ranks under fsdp and under zero stage 3 for one more step (3), an evaluation and model.pt; beside
# the same 4-rank run of fsdp from scratch (the control: its peak without a resume). For each checkout in TREES
# (label=path, run from that path) each resume REPS times, interleaved; the checkpoint and the control run from
# the current directory's checkout.
# Usage (from the repository root): TREES="before=<checkout> after=." [VENV=.venv] [REPS=3] sh <this folder>/run.sh
here=$(dirname "$0")
py=$(cd "${VENV:-.venv}/bin" && pwd)/python  # absolute, not resolved: the venv's own
out=$(mktemp -d /tmp/across.XXXX)
runs="$here/runs.txt"
common="model=gpt2 model.block_size=128 data=text data.val_fraction=0.002 data.batch_size=8 optim=adamw
  trainer.warmup_steps=1 trainer.ckpt_every_steps=2 trainer.keep_ckpts=1 trainer.amp=off trainer.progress=false"
run() {  # name tree n overrides...
  name=$1 tree=$2 n=$3; shift 3
  (cd "$tree" && PYTHONPATH=$(pwd) "$py" -m ddp_lab.distributed.torchrun --standalone --nproc_per_node=$n \
     -m ddp_lab.train $common "$@" hydra.run.dir="$out/$name") > "$out/$name.log" 2>&1
  grep -o "step 3/3  loss [0-9.]*  val loss [0-9.]*" "$out/$name.log" | sed "s|^|$name: |" >> "$here/losses.txt"
  grep -o "resumed from .*" "$out/$name.log" | head -1 | sed "s|^|$name: |" >> "$here/losses.txt"
  "$py" - "$out/$name/summary.json" "$name" <<'PY' | tee -a "$runs"
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except FileNotFoundError:
    print(sys.argv[2], "no summary")
    raise SystemExit
m = s["peak_mem_mb_by_rank"]
print(sys.argv[2], "peak MiB by rank", [round(x) for x in m], "max", round(max(m)), "steps", s.get("steps"))
PY
}
: > "$runs"
: > "$here/losses.txt"
run source . 2 sync=ddp trainer.max_steps=2
ckpt="$out/source/checkpoints/step-2"
du -sb "$ckpt"/* | sed "s|$out/||" | tee -a "$runs"
for rep in $(seq 1 "${REPS:-3}"); do
  for t in $TREES; do
    for sync in fsdp zero3; do
      case $sync in fsdp) over="sync=fsdp";; zero3) over="sync=zero sync.zero_stage=3";; esac
      run "$sync-${t%%=*}-$rep" "${t#*=}" 4 $over trainer.max_steps=3 trainer.resume="$ckpt"
      rm -rf "$out/$sync-${t%%=*}-$rep"
    done
  done
  run "fsdp-fresh-$rep" . 4 sync=fsdp trainer.max_steps=3
  rm -rf "$out/fsdp-fresh-$rep"
done
rm -rf "$out"
