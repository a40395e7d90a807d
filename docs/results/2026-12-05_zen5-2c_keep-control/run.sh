#!/bin/sh
# Is trainer.host_malloc=keep ddp_lab's fix or the machine's? The GPT race with its control: the plain loop
# under the same malloc settings (glibc's environment variables, which keep sets by mallopt), interleaved.
# From the repository root, alone (about 20 min):
#   sh docs/results/2026-12-05_zen5-2c_keep-control/run.sh
set -e
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
GPT="model=gpt_small model.block_size=128 data=text data.batch_size=16 optim=adamw"
KEEP="MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=2147483647"  # keep's two mallopt settings
race() {  # name peers-args...
  name=$1; shift
  rm -rf "/tmp/race-$name"
  "$py" -m ddp_lab.tools.bench.peers --out "/tmp/race-$name" --systems ddp_lab,plain_ddp \
    --variant "ddp_lab_keep=trainer.host_malloc=keep" --peer-variant "plain_keep=plain_ddp $KEEP" "$@"
  cp "/tmp/race-$name/results.json" "$here/$name.json"
  cp "/tmp/race-$name/table.md" "$here/$name.md"
  cp "/tmp/race-$name/record.json" "$here/$name-record.json"
}
race gpt-bf16 --rounds 5 --steps 40 -- $GPT trainer.amp=bf16
race gpt-fp32 --rounds 3 --steps 40 -- $GPT trainer.amp=off
