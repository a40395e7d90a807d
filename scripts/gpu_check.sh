#!/bin/bash
# The checks a GPU machine is for, in one call: the CUDA tests, ResNet-18's MFU, and the peers race on one GPU
# (the GPT's step profiled beside the plain loop's, the GPT race with a measuring variant, LeNet against
# the fastest peer).
#
#   bash scripts/gpu_check.sh prepare   # here, once: gpu/ (git-ignored) gets ../shared's Hydra wheels and data
#   bash scripts/gpu_check.sh [step]    # there, from the repository root with gpu/ carried; $OUT gets the results
#                                       # (step: the step's tests and the GPT race alone)
#
# Budget (an H200 machine, 2026-12-04): a launch takes ~16 s there, so a race of R rounds of S systems takes
# ~16*R*S s; the whole script ~9 minutes. Only small files come back (run dirs hold checkpoints).
set -u
R=$PWD
if [ "${1:-}" = prepare ]; then
  rm -rf gpu && mkdir -p gpu/wheels && grep -qx /gpu/ .git/info/exclude 2>/dev/null || echo /gpu/ >> .git/info/exclude
  cp ../shared/gpu-wheels/*.whl gpu/wheels/ && cp -r ../shared/data/fashion-mnist gpu/ \
    && cp -r ../shared/data/text-fortunes gpu/fortunes && du -sh gpu
  exit
fi
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT" /tmp/res/prof /usr/share/datasets /usr/share/games
python3 -m pip install -q --no-index --no-deps --target /tmp/site gpu/wheels/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$R
[ -e ddp_lab/conf ] || ln -s ../conf ddp_lab/conf  # what the package install maps (pyproject: package-dir)
ln -sfn "$R/gpu/fashion-mnist" /usr/share/datasets/fashion-mnist  # where the defaults look
ln -sfn "$R/gpu/fortunes" /usr/share/games/fortunes
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep "Model name"
  python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__)"; } > "$OUT/machine.txt" 2>&1

keep() {  # the small files of /tmp/res/$1 (and its printed output) as $OUT/$1.tgz
  (cd /tmp/res && find "$1" "$1.out" \( -name summary.json -o -name rank0.log -o -name output.log \
    -o -name results.json -o -name table.md -o -name '*.out' \) -print0 | tar czf "$OUT/$1.tgz" --null -T -)
}

cuda_tests() {
echo "== CUDA tests"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/training/test_no_host_sync.py \
  tests/collectives/test_allreduce.py tests/telemetry/test_stragglers.py tests/telemetry/test_mfu.py \
  tests/tools/baselines/test_data_parallel.py tests/sync/test_choices.py -m "not system" > "$OUT/tests.txt" 2>&1
tail -3 "$OUT/tests.txt"
}

resnet18() {
echo "== ResNet-18, 1 rank, 1 epoch"
timeout 60 python3 -m torch.distributed.run --standalone --nproc_per_node=1 -m ddp_lab.train model=resnet18 \
  trainer.epochs=1 trainer.compile=false hydra.run.dir=/tmp/res/resnet18 > /tmp/res/resnet18.out 2>&1
tail -2 /tmp/res/resnet18.out; keep resnet18
}

GPT="model=gpt_small model.block_size=128 data=text data.batch_size=16 optim=adamw trainer.amp=bf16"
profiles() {
echo "== the GPT's step profiled: ddp_lab and the plain loop, 10 steps after 60"
RUN="python3 -m torch.distributed.run --standalone --nproc_per_node=1"
timeout 40 $RUN -m ddp_lab.train $GPT hydra.run.dir=/tmp/res/prof/lab trainer.max_steps=80 trainer.warmup_steps=60 \
  trainer.epochs=1000 trainer.progress=false trainer.profile=true trainer.profile_wait=60 trainer.profile_active=10 \
  > /tmp/res/prof/lab.out 2>&1
timeout 40 $RUN -m ddp_lab.tools.bench.peers.plain_ddp --steps 80 --warmup 60 --profile-steps 10 \
  --out /tmp/res/prof/plain/summary.json $GPT > /tmp/res/prof/plain.out 2>&1
python3 -m ddp_lab.tools.bench.compare_profiles /tmp/res/prof/lab/profile/rank0.json \
  /tmp/res/prof/plain/profile/rank0.json --rows 30 \
  > "$OUT/prof_cmp.txt" 2>&1; head -4 "$OUT/prof_cmp.txt"
(cd /tmp/res/prof && tar czf "$OUT/prof.tgz" lab/profile plain/profile lab.out plain.out
 [ "$(stat -c %s "$OUT/prof.tgz")" -lt 16000000 ] || tar czf "$OUT/prof.tgz" lab/profile/*.txt plain/profile/*.txt)
}

race() {  # name, seconds, peers arguments...
  echo "== race $1"
  timeout "$2" python3 -m ddp_lab.tools.bench.peers --out "/tmp/res/$1" --nproc 1 --rounds 3 --steps 200 \
    --warmup 40 "${@:3}" > "/tmp/res/$1.out" 2>&1
  tail -7 "/tmp/res/$1.out"; keep "$1"
}

if [ "${1:-}" = step ]; then  # the step's checks alone (~4 minutes): its no-sync tests, the GPT race with a control
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/training/test_no_host_sync.py \
    tests/telemetry/test_stragglers.py tests/training/test_optim.py > "$OUT/tests.txt" 2>&1; tail -3 "$OUT/tests.txt"
  race gpt_bf16 170 --systems ddp_lab,plain_ddp --variant "foreach=optim.implementation=foreach" -- $GPT
  exit
fi
cuda_tests; resnet18; profiles
race gpt_bf16 200 --systems ddp_lab,plain_ddp --variant "measure_light=trainer.measure=light" -- $GPT
race lenet_bf16 110 --systems ddp_lab,with_accelerate -- model=lenet trainer.amp=bf16
