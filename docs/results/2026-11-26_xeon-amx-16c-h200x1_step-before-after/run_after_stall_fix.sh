#!/usr/bin/env bash
# ResNet-18 eager on one GPU: before (_before/, bfcb55b) and after (this tree), alternated; CUDA tests.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site _gpu/*.whl 2>&1 | grep -v WARNING | tail -2
ln -sfn ../conf ddp_lab/conf; ln -sfn ../conf _before/ddp_lab/conf
rm -rf _runs
ARGS="model=resnet18 data=synthetic trainer.epochs=4 trainer.compile=false trainer.progress=false"
res() { python3 -c "import json,sys; s=json.load(open(sys.argv[1]+'/summary.json')); print('RESULT', sys.argv[2], round(s['samples_per_sec']), 'img/s', round(100*s['mfu'],2), '%', 'step_ms', round(s['step_ms'],3))" "$1" "$2"; }
for round in 1 2; do
  for v in before after; do
    src=$PWD; [ $v = before ] && src=$PWD/_before
    (cd $src && PYTHONPATH=/tmp/site:$src timeout 200 torchrun --standalone --nproc_per_node=1 -m ddp_lab.train $ARGS hydra.run.dir=/tmp/_runs/$v-$round > /tmp/$v-$round.log 2>&1 || tail -20 /tmp/$v-$round.log)
    PYTHONPATH=/tmp/site res /tmp/_runs/$v-$round $v-$round
  done
done
echo "== CUDA tests"
PYTHONPATH=/tmp/site timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_stragglers.py tests/test_divergence.py \
  tests/collectives/test_allreduce.py tests/baselines/test_data_parallel.py -m "not slow" 2>&1 | tail -4
