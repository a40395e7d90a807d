#!/bin/sh
# Stage 3's peak RSS with glibc's default (dynamic) mmap threshold and with a fixed 1 MiB one
# (MALLOC_MMAP_THRESHOLD_: freed blocks of 1 MiB or more go back to the kernel), gpt2, AdamW,
# 2 CPU ranks, 3 steps; 3 repeats, interleaved.
# Usage (from the repository root): [VENV=path/to/venv] sh docs/results/2026-11-27_xeon-2c_zero-stages-memory/run_malloc.sh
set -e
here=$(dirname "$0")
out=$(mktemp -d /tmp/zero-malloc.XXXX)
head -c 300000 /usr/share/games/fortunes/fortunes > "$out/corpus.txt"
: > "$here/malloc.txt"
for repeat in 1 2 3; do
  for threshold in default 1048576; do
    if [ $threshold = default ]; then set --; else set -- MALLOC_MMAP_THRESHOLD_=$threshold; fi
    env "$@" ${VENV:-.venv}/bin/torchrun --standalone --nproc_per_node=2 -m ddp_lab.train \
      model=gpt2 data=text data.path="$out/corpus.txt" data.val_fraction=0.1 data.batch_size=2 \
      optim=adamw sync=zero sync.zero_stage=3 trainer.max_steps=3 trainer.warmup_steps=1 trainer.keep_ckpts=0 \
      trainer.compile=false trainer.amp=off trainer.progress=false \
      hydra.run.dir="$out/$repeat-$threshold" > "$out/$repeat-$threshold.log" 2>&1
    ${VENV:-.venv}/bin/python -c "import json,sys; s=json.load(open(sys.argv[1])); print(*sys.argv[2:], s['peak_mem_mb_by_rank'], s['model_state_bytes'], s['val_loss'])" \
      "$out/$repeat-$threshold/summary.json" $repeat $threshold | tee -a "$here/malloc.txt"
  done
done
rm -rf "$out"
