#!/usr/bin/env bash
# ResNet-18 on one GPU, before (the tree in _before/, bfcb55b) and after (this tree),
# alternated twice; then the CUDA tests. Everything printed goes to $OUT/log.txt too.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site _gpu/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
# conf/ ships as ddp_lab.conf through pip's package-dir; without an install, a link does it
ln -sfn ../conf ddp_lab/conf; ln -sfn ../conf _before/ddp_lab/conf
nvidia-smi --query-gpu=name,memory.total --format=csv
python3 -c "import torch, platform; print('torch', torch.__version__, 'python', platform.python_version())"
lscpu | grep -E "Model name|^CPU\(s\)"
ARGS="model=resnet18 data=synthetic trainer.epochs=4 trainer.compile=false trainer.progress=false"
run() {  # $1: before|after  $2: round
  local dir=$PWD/_runs/$1-$2 src=$PWD
  [ "$1" = before ] && src=$PWD/_before
  (cd "$src" && PYTHONPATH=/tmp/site:$src timeout 240 torchrun --standalone --nproc_per_node=1 \
     -m ddp_lab.train $ARGS hydra.run.dir="$dir" 2>&1 | tail -8)
  python3 - "$dir" "$1" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
print(f"RESULT {sys.argv[2]} round {sys.argv[3]}: img/s {s['samples_per_sec']:.0f} mfu {100*s['mfu']:.2f}% "
      f"step_ms {s.get('step_ms', float('nan'))} test_acc {s['test_acc']:.4f}")
PY
}
for round in 1 2; do run before $round; run after $round; done
echo "== CUDA tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_stragglers.py tests/test_divergence.py \
  tests/collectives/test_allreduce.py tests/baselines/test_data_parallel.py -m "not slow" 2>&1 | tail -15
