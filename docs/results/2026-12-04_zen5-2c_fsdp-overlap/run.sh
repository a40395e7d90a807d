#!/bin/sh
# sync=fsdp with sync.overlap (gathers a unit ahead; with sync.algo=direct the reduce-scatters left travelling)
# against fsdp without it and DDP. Speed: 2 emulated hosts at 1 Gbit/s, one rank each, gpt_small with AdamW, 12 steps
# (the first 4 not timed), trainer.host_malloc=glibc (fsdp's faster regime there) but for the lean row (the default
# malloc of a sharded model), 3 repeats, the 5 runs interleaved. Peaks: gpt2 with AdamW at 2 ranks on loopback,
# 3 steps with a checkpoint, an evaluation and model.pt (a rank's whole life), fsdp/direct with and without overlap,
# 2 repeats interleaved. As root, from the repository root: sh docs/results/2026-12-04_zen5-2c_fsdp-overlap/run.sh
here=$(dirname "$0")
py=$(cd "${VENV:-.venv}/bin" && pwd)/python
out=$(mktemp -d /tmp/fsdp-overlap.XXXX)
head -c 300000 /usr/share/games/fortunes/fortunes > "$out/corpus.txt"
report() {  # summary.json name repeat
  "$py" - "$@" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
    print(*sys.argv[2:], "step_ms", round(s["step_ms"], 1), "peak_mb_by_rank", [round(m) for m in s["peak_mem_mb_by_rank"]],
          "predicted_mb", round(max(s["predicted_peak_mb_by_rank"])), "val_loss", s["val_loss"], "sync", s["sync"])
except FileNotFoundError:
    print(*sys.argv[2:], "no summary")
PY
}
common="model=gpt_small data=text data.path=$out/corpus.txt data.val_fraction=0.05 data.batch_size=8 optim=adamw
  trainer.max_steps=12 trainer.warmup_steps=4 trainer.keep_ckpts=0 trainer.compile=false trainer.amp=off
  trainer.progress=false trainer.log_every=4 trainer.host_malloc=glibc"
runs="ddp:sync=ddp fsdp-direct:sync=fsdp,sync.algo=direct fsdp-direct+overlap:sync=fsdp,sync.algo=direct,sync.overlap=true
  fsdp-builtin+overlap:sync=fsdp,sync.algo=builtin,sync.overlap=true
  fsdp-direct+overlap-lean:sync=fsdp,sync.algo=direct,sync.overlap=true,trainer.host_malloc=auto"
: > "$here/speed.txt"
"$py" -m ddp_lab.tools.cluster up --name fo --hosts 2 --rate 1gbit > /dev/null
for repeat in 1 2 3; do
  for s in $runs; do
    name=${s%%:*}; overrides=$(echo "${s#*:}" | tr , ' ')
    "$py" -m ddp_lab.tools.cluster run --name fo -- -m ddp_lab.train $common $overrides \
      hydra.run.dir="$out/$name-$repeat" > "$out/$name-$repeat.log" 2>&1
    report "$out/$name-$repeat/summary.json" "$name" "$repeat" | tee -a "$here/speed.txt"
  done
done
"$py" -m ddp_lab.tools.cluster down --name fo > /dev/null
common="model=gpt2 model.block_size=128 data=text data.path=$out/corpus.txt data.val_fraction=0.02 data.batch_size=8
  optim=adamw trainer.max_steps=3 trainer.warmup_steps=1 trainer.ckpt_every_steps=2 trainer.keep_ckpts=1
  trainer.amp=off trainer.progress=false sync=fsdp sync.algo=direct"
: > "$here/peaks.txt"
for repeat in 1 2; do
  for overlap in false true; do
    "$py" -m ddp_lab.distributed.torchrun --standalone --nproc_per_node=2 -m ddp_lab.train $common \
      sync.overlap=$overlap hydra.run.dir="$out/gpt2-$overlap-$repeat" > "$out/gpt2-$overlap-$repeat.log" 2>&1
    report "$out/gpt2-$overlap-$repeat/summary.json" "gpt2-overlap=$overlap" "$repeat" | tee -a "$here/peaks.txt"
  done
done
rm -rf "$out"
