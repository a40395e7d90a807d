#!/bin/sh
# ZeRO stage 3 with sync.overlap_reduce=false (each gradient reduce-scatter waited for where it is sent) against
# stage 3 at its default (one left travelling while the next unit's backward runs) and fsdp.
# Peaks: gpt2 with AdamW on loopback at 2, 4 and 8 ranks (4 and 8 oversubscribe 2 cores), global batch 8, 3 steps
# with a checkpoint, an evaluation and model.pt (a rank's whole life: the runs of the stage3-peak record); 2 repeats
# at 2 and 4 ranks, 3 at 8, the three interleaved. Speed: 2 emulated hosts at 1 Gbit/s, one rank each, gpt_small
# with AdamW, 12 steps (the first 4 not timed), DDP and both stage 3 runs, 3 repeats interleaved; every run at its
# defaults otherwise. As root, from the repository root: sh docs/results/2026-12-05_zen5-2c_stage3-overlap-reduce/run.sh
here=$(dirname "$0")
py=$(cd "${VENV:-.venv}/bin" && pwd)/python
out=$(mktemp -d /tmp/overlap-reduce.XXXX)
head -c 300000 /usr/share/games/fortunes/fortunes > "$out/corpus.txt"
report() {  # summary.json name ranks repeat
  "$py" - "$@" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
    m = s["peak_mem_mb_by_rank"]
    print(*sys.argv[2:], "peak_mb_by_rank", [round(x) for x in m], "max", round(max(m)),
          "predicted_mb", round(max(s["predicted_peak_mb_by_rank"])), "step_ms", round(s["step_ms"], 1),
          "val_loss", s["val_loss"], "sync", s["sync"])
except FileNotFoundError:
    print(*sys.argv[2:], "no summary")
PY
}
runs="zero3:sync=zero,sync.zero_stage=3 zero3-wait:sync=zero,sync.zero_stage=3,sync.overlap_reduce=false fsdp:sync=fsdp"
common="model=gpt2 model.block_size=128 data=text data.val_fraction=0.002 data.batch_size=8 optim=adamw
  trainer.max_steps=3 trainer.warmup_steps=1 trainer.ckpt_every_steps=2 trainer.keep_ckpts=1 trainer.amp=off
  trainer.progress=false"
: > "$here/peaks.txt"
for n in 2 4 8; do
  reps="1 2"; [ $n = 8 ] && reps="1 2 3"
  for repeat in $reps; do
    for s in $runs; do
      name=${s%%:*}; overrides=$(echo "${s#*:}" | tr , ' ')
      "$py" -m ddp_lab.distributed.torchrun --standalone --nproc_per_node=$n -m ddp_lab.train $common $overrides \
        hydra.run.dir="$out/$name-$n-$repeat" > "$out/$name-$n-$repeat.log" 2>&1
      report "$out/$name-$n-$repeat/summary.json" "$name" "$n" "$repeat" | tee -a "$here/peaks.txt"
      rm -rf "$out/$name-$n-$repeat"
    done
  done
done
common="model=gpt_small data=text data.path=$out/corpus.txt data.val_fraction=0.05 data.batch_size=8 optim=adamw
  trainer.max_steps=12 trainer.warmup_steps=4 trainer.keep_ckpts=0 trainer.compile=false trainer.amp=off
  trainer.progress=false trainer.log_every=4"
: > "$here/speed.txt"
"$py" -m ddp_lab.tools.cluster up --name orr --hosts 2 --rate 1gbit > /dev/null
for repeat in 1 2 3; do
  for s in ddp:sync=ddp $runs; do
    name=${s%%:*}; [ "$name" = fsdp ] && continue
    overrides=$(echo "${s#*:}" | tr , ' ')
    "$py" -m ddp_lab.tools.cluster run --name orr -- -m ddp_lab.train $common $overrides \
      hydra.run.dir="$out/$name-$repeat" > "$out/$name-$repeat.log" 2>&1
    report "$out/$name-$repeat/summary.json" "$name" 2 "$repeat" | tee -a "$here/speed.txt"
  done
done
"$py" -m ddp_lab.tools.cluster down --name orr > /dev/null
rm -rf "$out"
