#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site _gpu/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=/tmp/site:$PWD
ln -sfn ../conf ddp_lab/conf; ln -sfn ../conf _before/ddp_lab/conf
ARGS="model=resnet18 data=synthetic trainer.epochs=4 trainer.compile=false trainer.progress=false"
res() { python3 -c "import json,sys; s=json.load(open(sys.argv[1]+'/summary.json')); print('RESULT', sys.argv[2], round(s['samples_per_sec']), 'img/s', round(100*s['mfu'],2), '%')" "$1" "$2"; }
for v in data-sync all-syncs after; do
  timeout 200 torchrun --standalone --nproc_per_node=1 _gpu/variant.py $v $ARGS hydra.run.dir=$PWD/_runs/$v > /tmp/$v.log 2>&1 || tail -20 /tmp/$v.log
  res $PWD/_runs/$v $v
done
(cd _before && PYTHONPATH=/tmp/site:$PWD timeout 200 torchrun --standalone --nproc_per_node=1 -m ddp_lab.train $ARGS hydra.run.dir=$OLDPWD/_runs/before > /tmp/before.log 2>&1 || tail -20 /tmp/before.log)
res $PWD/_runs/before before
