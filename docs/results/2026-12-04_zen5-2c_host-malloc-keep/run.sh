#!/bin/sh
# trainer.host_malloc=keep on the GPT of the peers race, fp32, 2 ranks: the race (3 interleaved rounds, keep as a
# ddp_lab variant beside ddp_lab's default, the plain loop and Accelerate), then each system's page faults at 40 and
# 80 steps (faults.txt). From the repository root, alone: sh docs/results/2026-12-04_zen5-2c_host-malloc-keep/run.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
GPT="model=gpt_small model.block_size=128 data=text data.batch_size=16 optim=adamw trainer.amp=off"
"$py" -m ddp_lab.tools.bench.peers --out /tmp/race-fp32 --rounds 3 --steps 40 --systems ddp_lab,plain_ddp,with_accelerate \
  --variant "ddp_lab_keep=trainer.host_malloc=keep" -- $GPT
cp /tmp/race-fp32/results.json /tmp/race-fp32/table.md /tmp/race-fp32/record.json "$here/"
for s in "plain_ddp:" "ddp_lab:" "ddp_lab:sync=ddp" "ddp_lab:trainer.host_malloc=keep" "ddp_lab:sync.overlap_backward=false"; do
  for n in 40 80; do
    /usr/bin/time -f "${s%%:*} ${s#*:} steps=$n minor=%R" "$py" -m ddp_lab.tools.bench.peers --out /tmp/faults-$n \
      --rounds 1 --steps $n --systems ${s%%:*} $( [ -n "${s#*:}" ] && echo --ddp-lab-args "${s#*:}") -- $GPT 2>&1 | tail -1
  done
done
