#!/bin/sh
# ZeRO stage 3's measured peak of every rank against fsdp's: gpt2 with AdamW at 2, 4 and 8 ranks on one machine
# (torchrun, loopback), global batch 8, 3 steps with a checkpoint at step 2, an evaluation and model.pt: a rank's
# whole life (the runs of 2026-11-29_zen4-2c_peak-prediction). For each checkout in TREES (label=path, run from
# that path), zero3 (sync.algo=direct, the default) REPS times, interleaved with fsdp (run from the current
# directory's checkout); then zero3 under sync.algo=builtin once per checkout.
# Usage (from the repository root): TREES="before=<checkout> after=." [VENV=.venv] [REPS=3] [RUNS=runs.txt] \
#   sh <this folder>/run.sh
here=$(dirname "$0")
py=$(cd "${VENV:-.venv}/bin" && pwd)/python  # absolute, not resolved: the venv's own
out=$(mktemp -d /tmp/peak.XXXX)
runs="$here/${RUNS:-runs.txt}"
common="model=gpt2 model.block_size=128 data=text data.val_fraction=0.002 data.batch_size=8 optim=adamw
  trainer.max_steps=3 trainer.warmup_steps=1 trainer.ckpt_every_steps=2 trainer.keep_ckpts=1 trainer.amp=off
  trainer.progress=false"
zero3="sync=zero sync.zero_stage=3"
run() {  # name tree n rep overrides...
  name=$1 tree=$2 n=$3 rep=$4; shift 4
  log="$out/$name-$n-$rep.log"
  (cd "$tree" && PYTHONPATH=$(pwd) "$py" -m ddp_lab.distributed.torchrun --standalone --nproc_per_node=$n \
     -m ddp_lab.train $common "$@" hydra.run.dir="$out/$name-$n-$rep") > "$log" 2>&1
  grep -o "step 3/3  loss [0-9.]*  val loss [0-9.]*" "$log" \
    | sed "s|step 3/3  loss \([0-9.]*\)  val loss \([0-9.]*\)|$name-$n-$rep: step 3 loss \1, val loss \2|" \
    >> "${runs%.txt}-losses.txt"
  "$py" - "$out/$name-$n-$rep/summary.json" "$name" "$n" "$rep" <<'PY' | tee -a "$runs"
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except FileNotFoundError:
    print(*sys.argv[2:], "no summary")
    raise SystemExit
m, p = s["peak_mem_mb_by_rank"], s["predicted_peak_mb_by_rank"]
print(*sys.argv[2:], "measured", [round(x) for x in m], "max", round(max(m)), "predicted", round(max(p)),
      "step_ms", round(s["step_ms"]))
PY
  rm -rf "$out/$name-$n-$rep"
}
: > "$runs"
: > "${runs%.txt}-losses.txt"
for n in 2 4 8; do
  for rep in $(seq 1 "${REPS:-3}"); do
    for t in $TREES; do run "zero3-${t%%=*}" "${t#*=}" $n $rep $zero3; done
    run fsdp . $n $rep sync=fsdp
  done
  for t in $TREES; do run "zero3-builtin-${t%%=*}" "${t#*=}" $n 1 $zero3 sync.algo=builtin; done
done
rm -rf "$out"
