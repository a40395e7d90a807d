#!/bin/sh
# The peers race on the GPT in fp32, 5 interleaved rounds, from the repository root (rounds.csv from results.json).
python -m ddp_lab.tools.bench.peers --out gpt-fp32 --rounds 5 --steps 40 -- model=gpt_small model.block_size=128 \
  data=text data.batch_size=16 optim=adamw trainer.amp=off
