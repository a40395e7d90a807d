#!/bin/sh
# Step time of DDP, ZeRO stages 1-3 (torch's collectives and ours; stage 3 with and without its
# prefetch) and FSDP2 on 2 emulated hosts (1gbit links, one rank a host), and of DDP and stage 3
# on loopback (2 ranks, torchrun --standalone): model=gpt_small with AdamW, 12 steps (the first
# 4 not timed), 3 repeats interleaved; then the cost model's price of each on the 1gbit link,
# from a one-rank run's compute time, for torch's collectives on gloo and for ours.
# Usage (from the repository root, as root): [VENV=path/to/venv] sh docs/results/2026-11-28_xeon-2c_zero-step-time/run.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/zero-step.XXXX)
head -c 300000 /usr/share/games/fortunes/fortunes > "$out/corpus.txt"
common="model=gpt_small data=text data.path=$out/corpus.txt data.val_fraction=0.05 data.batch_size=8 optim=adamw
  trainer.max_steps=12 trainer.warmup_steps=4 trainer.keep_ckpts=0 trainer.compile=false trainer.amp=off
  trainer.progress=false trainer.log_every=4"
zero="sync=zero,sync.zero_stage"
hosts="ddp:sync=ddp zero1:sync=zero zero1-ours:sync=zero,sync.algo=ring_textbook zero2:$zero=2
  zero2-ours:$zero=2,sync.algo=ring_textbook zero3:$zero=3 zero3-noprefetch:$zero=3,sync.prefetch=false
  fsdp:sync=fsdp"
loopback="ddp:sync=ddp zero3:$zero=3 zero3-noprefetch:$zero=3,sync.prefetch=false"
summary() {  # summary.json, labels...
  "$py" - "$@" <<'PY' | tee -a "$here/runs.txt"
import json, sys
try:
    s = json.load(open(sys.argv[1]))
    print(*sys.argv[2:], "step_ms", round(s["step_ms"], 1), "wire_bytes_per_step", s["wire_bytes_per_step"],
          "val_loss", s["val_loss"], "sync", s["sync"])
except FileNotFoundError:
    print(*sys.argv[2:], "no summary")
PY
}
: > "$here/runs.txt"
OMP_NUM_THREADS=1 "$py" -m torch.distributed.run --standalone --nproc_per_node=1 -m ddp_lab.train $common \
  data.batch_size=4 hydra.run.dir="$out/one-rank" > "$here/one-rank.log" 2>&1
summary "$out/one-rank/summary.json" one-rank 1-thread compute
"$py" -m ddp_lab.cluster up --name step --hosts 2 --rate 1gbit | tee "$here/cluster.txt"
for repeat in 1 2 3; do
  for s in $hosts; do
    name=${s%%:*}; overrides=$(echo "${s#*:}" | tr , ' ')
    "$py" -m ddp_lab.cluster run --name step -- -m ddp_lab.train $common $overrides \
      hydra.run.dir="$out/hosts-$name-$repeat" > "$here/hosts-$name-$repeat.log" 2>&1
    summary "$out/hosts-$name-$repeat/summary.json" hosts "$name" "$repeat"
  done
  for s in $loopback; do
    name=${s%%:*}; overrides=$(echo "${s#*:}" | tr , ' ')
    "$py" -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train $common $overrides \
      hydra.run.dir="$out/loopback-$name-$repeat" > "$here/loopback-$name-$repeat.log" 2>&1
    summary "$out/loopback-$name-$repeat/summary.json" loopback "$name" "$repeat"
  done
done
"$py" -m ddp_lab.cluster down --name step
compute=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['step_ms'])" "$out/one-rank/summary.json")
for algo in builtin ring_textbook; do
  "$py" -m ddp_lab.costmodel.will_it_fit --ranks 2 --memory 8GiB --link 1gbit --compute-ms "$compute" -- \
    model=gpt_small data=text data.path="$out/corpus.txt" data.batch_size=8 optim=adamw sync.algo=$algo \
    | tee "$here/prediction-$algo.txt"
done
rm -rf "$out"
