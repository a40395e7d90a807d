#!/bin/sh
# The peers race on the GPT, bf16 and fp32, 3 interleaved rounds each, from the repository root.
set -e
GPT="model=gpt_small model.block_size=128 data=text data.batch_size=16 optim=adamw"
python -m ddp_lab.tools.bench.peers --out gpt-bf16 --rounds 3 --steps 40 -- $GPT trainer.amp=bf16
python -m ddp_lab.tools.bench.peers --out gpt-fp32 --rounds 3 --steps 40 -- $GPT trainer.amp=off
