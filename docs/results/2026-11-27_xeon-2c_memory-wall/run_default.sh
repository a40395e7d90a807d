#!/bin/sh
# Stage 3 and FSDP2 under the same 2.4 GiB limit without MALLOC_MMAP_THRESHOLD_, once they set glibc's
# mmap threshold themselves (zero3.return_freed_blocks): the run run.sh's zero3-glibc-default lost.
# Usage (from the repository root, as root): [VENV=path/to/venv] [LIMIT=2.4g] sh docs/results/2026-11-27_xeon-2c_memory-wall/run_default.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/memory-wall.XXXX)
head -c 300000 /usr/share/games/fortunes/fortunes > "$out/corpus.txt"
common="model=gpt2 data=text data.path=$out/corpus.txt data.val_fraction=0.1 data.batch_size=2 optim=adamw
  trainer.max_steps=3 trainer.warmup_steps=1 trainer.keep_ckpts=0 trainer.compile=false trainer.amp=off
  trainer.progress=false dist.timeout_s=120"
"$py" -m ddp_lab.cluster up --name wall --hosts 2 --rate 2gbit --mem "${LIMIT:-2.4g}" | tee -a "$here/cluster.txt"
for name in zero3 fsdp; do
  if [ $name = zero3 ]; then sync="sync=zero sync.zero_stage=3"; else sync="sync=fsdp"; fi
  env -u MALLOC_MMAP_THRESHOLD_ "$py" -m ddp_lab.cluster run --name wall --grace-s 30 -- -m ddp_lab.train $common \
    $sync hydra.run.dir="$out/$name-default" > "$here/$name-default.log" 2>&1
  rc=$?
  "$py" -c "import json,sys; s=json.load(open(sys.argv[1])); print(sys.argv[2], 'rc', sys.argv[3], 'val_loss', s['val_loss'], 'model_state_bytes', s['model_state_bytes'], 'peak_mem_mb_by_rank', s['peak_mem_mb_by_rank'], 'sync', s['sync'])" \
    "$out/$name-default/summary.json" "$name-default" $rc 2>/dev/null | tee -a "$here/runs.txt" || echo "$name-default rc $rc no summary" | tee -a "$here/runs.txt"
done
"$py" -m ddp_lab.cluster down --name wall
rm -rf "$out"
