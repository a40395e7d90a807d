#!/bin/sh
# run.sh's runs for sync=fsdp (torch's FSDP2), and for stage 3 again once it sets glibc's mmap threshold
# itself (zero3.return_freed_blocks; run.sh's stage 3 had glibc's default): same models, ranks and steps.
# Usage (from the repository root): [VENV=path/to/venv] sh docs/results/2026-11-27_xeon-2c_zero-stages-memory/run_fsdp.sh
set -e
here=$(dirname "$0")
out=$(mktemp -d /tmp/zero-memory.XXXX)
head -c 300000 /usr/share/games/fortunes/fortunes > "$out/corpus.txt"
: > "$here/runs_fsdp.txt"
for model in gpt_small gpt2; do
  for n in 2 4; do
    for sync in fsdp zero3; do
      case $sync in
        fsdp) args="sync=fsdp" ;;
        *) args="sync=zero sync.zero_stage=3" ;;
      esac
      env -u MALLOC_MMAP_THRESHOLD_ ${VENV:-.venv}/bin/torchrun --standalone --nproc_per_node=$n -m ddp_lab.train \
        model=$model data=text data.path="$out/corpus.txt" data.val_fraction=0.1 data.batch_size=$n \
        optim=adamw $args trainer.max_steps=3 trainer.warmup_steps=1 trainer.keep_ckpts=0 \
        trainer.compile=false trainer.amp=off trainer.progress=false \
        hydra.run.dir="$out/$model-$n-$sync" > "$here/$model-$n-$sync-now.log" 2>&1
      ${VENV:-.venv}/bin/python -c "import json,sys; s=json.load(open(sys.argv[1])); print(*sys.argv[2:], s['model_state_bytes'], s['peak_mem_mb_by_rank'], s['sync'], s['val_loss'], s['wire_bytes_per_step'], s['step_ms'])" \
        "$out/$model-$n-$sync/summary.json" $model $n $sync | tee -a "$here/runs_fsdp.txt"
    done
  done
done
rm -rf "$out"
