#!/bin/sh
# DiLoCo's outer sync in 4 bits overlapped with 4 inner steps (sync.overlap=4 sync.compress=int4), its
# all-gather started halfway (this commit) against started when the outer step lands (the code before it,
# a worktree at OLD), with DiLoCo in 4 bits that waits (overlap 0) on the same hosts and on loopback (2
# ranks, torchrun --standalone): the small GPT (model=gpt, 834k parameters) with AdamW, sync.every=8, 72
# steps of which the first 8 are not timed, 2 emulated hosts with 10 Mbit/s links, 3 repeats interleaved;
# step_ms, bytes and the validation loss from summary.json (runs.txt); summarize.py makes table.md.
# Usage (from the repository root, as root): OLD=/path/to/worktree-at-the-commit-before [VENV=path/to/venv] sh docs/results/2026-11-28_zen4-2c_diloco-int4-overlap-halfway/run.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/int4-halfway.XXXX)
common="model=gpt data=text optim=adamw sync=diloco sync.every=8 trainer.max_steps=72 trainer.warmup_steps=8
  trainer.keep_ckpts=0 trainer.progress=false trainer.log_every=8 sync.compress=int4"
summary() {  # summary.json, labels...
  "$py" - "$@" <<'PY' | tee -a "$here/runs.txt"
import json, sys
try:
    s = json.load(open(sys.argv[1]))
    print(*sys.argv[2:], "step_ms", round(s["step_ms"], 1), "wire_bytes_per_step", s["wire_bytes_per_step"],
          "val_loss", round(s["val_loss"], 6), "sync", s["sync"])
except FileNotFoundError:
    print(*sys.argv[2:], "no summary")
PY
}
: > "$here/runs.txt"
"$py" -m ddp_lab.cluster down --name half 2>/dev/null
"$py" -m ddp_lab.cluster up --name half --hosts 2 --rate 10mbit | tee "$here/cluster.txt"
for repeat in 1 2 3; do
  for s in wait:.:0 landing:$OLD:4 halfway:.:4; do
    name=${s%%:*}; rest=${s#*:}; tree=${rest%%:*}; overlap=${rest#*:}
    (cd "$tree" && "$py" -m ddp_lab.cluster run --name half -- -m ddp_lab.train $common sync.overlap=$overlap \
      hydra.run.dir="$out/hosts-$name-$repeat") > "$here/hosts-$name-$repeat.log" 2>&1
    summary "$out/hosts-$name-$repeat/summary.json" hosts "$name" "$repeat"
  done
  "$py" -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train $common \
    hydra.run.dir="$out/loopback-$repeat" > "$here/loopback-$repeat.log" 2>&1
  summary "$out/loopback-$repeat/summary.json" loopback wait "$repeat"
done
"$py" -m ddp_lab.cluster down --name half
rm -rf "$out"
"$py" "$here/summarize.py" "$here" | tee "$here/table.md"
