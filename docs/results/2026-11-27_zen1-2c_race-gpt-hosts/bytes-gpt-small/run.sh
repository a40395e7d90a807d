#!/bin/bash
# PowerSGD's bytes on a larger GPT (model=gpt_small: 10.8M parameters, 384-wide matrices) against DDP's,
# counted where they are sent: 20 steps on 2 ranks, PowerSGD plain for its first 2 (short sequences and a
# small held-out part only to keep the run short: the bytes depend on the parameters alone).
set -euo pipefail
R=docs/results/2026-11-27_zen1-2c_race-gpt-hosts/bytes-gpt-small
C="torchrun --standalone --nproc_per_node=2 -m ddp_lab.train model=gpt_small data=text optim=adamw data.batch_size=4
   data.block_size=64 data.val_fraction=0.002 trainer.max_steps=20 trainer.eval_every=0 trainer.progress=false
   trainer.keep_ckpts=0 trainer.amp=off"
$C sync=powersgd sync.powersgd_start_step=2 hydra.run.dir=/tmp/bench/gs-psgd > $R/powersgd.log 2>&1
$C sync=ddp hydra.run.dir=/tmp/bench/gs-ddp > $R/ddp.log 2>&1
cp /tmp/bench/gs-psgd/summary.json $R/powersgd-summary.json; cp /tmp/bench/gs-ddp/summary.json $R/ddp-summary.json
