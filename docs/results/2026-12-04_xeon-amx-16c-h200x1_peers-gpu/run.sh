# What ran, in one device call at 6ee5ef0 (scripts/gpu_check.sh is its successor), from the repository root:
# Hydra's wheels installed to /tmp/site, ddp_lab/conf linked to conf/, the Fashion-MNIST files and the
# fortunes text linked where Debian puts them.
export PYTHONPATH=/tmp/site:$PWD
python3 -m pytest -q tests/training/test_no_host_sync.py tests/collectives/test_allreduce.py \
  tests/telemetry/test_stragglers.py tests/telemetry/test_mfu.py tests/tools/baselines/test_data_parallel.py \
  tests/sync/test_choices.py
python3 -m torch.distributed.run --standalone --nproc_per_node=1 -m ddp_lab.train model=resnet18 \
  trainer.epochs=2 trainer.compile=false
GPT="model=gpt_small model.block_size=128 data=text data.batch_size=16 optim=adamw"
race() { timeout 190 python3 -m ddp_lab.tools.bench.peers --out /tmp/res/$1 --nproc 1 --rounds 3 --steps 200 \
  --warmup 40 "${@:2}"; }
race gpt_bf16_4way -- $GPT trainer.amp=bf16  # ran out of its 190 s in round 3
race lenet_bf16_4way -- model=lenet trainer.amp=bf16  # likewise
race gpt_bf16 --systems ddp_lab,plain_ddp -- $GPT trainer.amp=bf16
