#!/bin/sh
# The one-rank compute of step.sh's configuration, 3 times, and the cost model's price of each
# strategy on the 1gbit link from their median, for torch's collectives on gloo and for ours.
# Usage (from the repository root): [VENV=path/to/venv] sh docs/results/2026-11-28_xeon-2c_zero-direct/price.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/zero-price.XXXX)
head -c 300000 /usr/share/games/fortunes/fortunes > "$out/corpus.txt"
common="model=gpt_small data=text data.path=$out/corpus.txt data.val_fraction=0.05 data.batch_size=4 optim=adamw
  trainer.max_steps=12 trainer.warmup_steps=4 trainer.keep_ckpts=0 trainer.compile=false trainer.amp=off
  trainer.progress=false trainer.log_every=4"
mkdir -p "$here/price"
: > "$here/price/one-rank.txt"
for repeat in 1 2 3; do
  OMP_NUM_THREADS=1 "$py" -m torch.distributed.run --standalone --nproc_per_node=1 -m ddp_lab.train $common \
    hydra.run.dir="$out/one-rank-$repeat" > "$here/price/one-rank-$repeat.log" 2>&1
  "$py" -c "import json,sys; print('one-rank', sys.argv[2], 'step_ms', round(json.load(open(sys.argv[1]))['step_ms'], 1))" \
    "$out/one-rank-$repeat/summary.json" "$repeat" | tee -a "$here/price/one-rank.txt"
done
compute=$(awk '{print $4}' "$here/price/one-rank.txt" | sort -n | sed -n 2p)
for algo in builtin direct; do
  "$py" -m ddp_lab.costmodel.will_it_fit --ranks 2 --memory 8GiB --link 1gbit --compute-ms "$compute" -- \
    model=gpt_small data=text data.path="$out/corpus.txt" data.batch_size=8 optim=adamw sync.algo=$algo \
    | tee "$here/price/prediction-$algo.txt"
done
rm -rf "$out"
