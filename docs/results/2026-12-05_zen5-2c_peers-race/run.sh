#!/bin/sh
# The peers race on the GPT and on LeNet, bf16 and fp32, 3 interleaved rounds each, at today's defaults (the
# 2026-12-02 race ran before host_malloc's regimes and a week of changes). On the GPT ddp_lab also runs with
# trainer.host_malloc=keep (opt-in). From the repository root, alone:
#   sh docs/results/2026-12-05_zen5-2c_peers-race/run.sh
set -e
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
GPT="model=gpt_small model.block_size=128 data=text data.batch_size=16 optim=adamw"
race() {  # name peers-args...
  name=$1; shift
  "$py" -m ddp_lab.tools.bench.peers --out "/tmp/race-$name" "$@"
  cp "/tmp/race-$name/results.json" "$here/$name.json"
  cp "/tmp/race-$name/table.md" "$here/$name.md"
  cp "/tmp/race-$name/record.json" "$here/$name-record.json"
}
race gpt-bf16 --rounds 3 --steps 40 --variant "ddp_lab_keep=trainer.host_malloc=keep" -- $GPT trainer.amp=bf16
race gpt-fp32 --rounds 3 --steps 40 --variant "ddp_lab_keep=trainer.host_malloc=keep" -- $GPT trainer.amp=off
race lenet-bf16 --rounds 3 --steps 120 --warmup 20 -- trainer.amp=bf16
race lenet-fp32 --rounds 3 --steps 120 --warmup 20 -- trainer.amp=off
