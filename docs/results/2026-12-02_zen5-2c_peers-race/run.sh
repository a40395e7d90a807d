#!/bin/sh
# The peers race on the GPT and on LeNet, bf16 and fp32, 3 interleaved rounds each, from the repository root.
# On the GPT, ddp_lab also runs with flat's one buffer after the backward (sync=flat sync.buffer_mb=0, the default
# before its buffers left in the backward): the control that isolates the overlap. LeNet's 0.25 MB of
# gradients fit one buffer either way.
set -e
GPT="model=gpt_small model.block_size=128 data=text data.batch_size=16 optim=adamw"
python -m ddp_lab.tools.bench.peers --out gpt-bf16 --rounds 3 --steps 40 --variant "flat_one_buffer=sync=flat sync.buffer_mb=0" -- $GPT trainer.amp=bf16
python -m ddp_lab.tools.bench.peers --out gpt-fp32 --rounds 3 --steps 40 --variant "flat_one_buffer=sync=flat sync.buffer_mb=0" -- $GPT trainer.amp=off
python -m ddp_lab.tools.bench.peers --out lenet-bf16 --rounds 3 --steps 120 --warmup 20 -- trainer.amp=bf16
python -m ddp_lab.tools.bench.peers --out lenet-fp32 --rounds 3 --steps 120 --warmup 20 -- trainer.amp=off
