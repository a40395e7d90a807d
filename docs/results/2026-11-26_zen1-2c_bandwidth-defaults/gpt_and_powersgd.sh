#!/bin/bash
run() { name=$1; shift; DDP_LAB_RUN_ID=$name timeout 900 /work/main/.venv/bin/torchrun --standalone --nproc_per_node=2 -m ddp_lab.train trainer.keep_ckpts=0 trainer.progress=false "$@" > $name.out 2>&1; echo "$name $(python3 -c "import json;s=json.load(open('outputs/$name/summary.json'));print(s.get('test_acc'), s.get('val_loss'), s['train_loss'], s['wire_bytes_per_step'], s['step_ms'])" 2>/dev/null || echo FAIL)"; }
G="model=gpt data=text optim=adamw trainer.epochs=1 trainer.max_steps=300"
run psgd100 sync=powersgd trainer.epochs=2
run gpt_ddp $G sync=ddp
run gpt_diloco16_07_09 $G sync=diloco sync.every=16
run gpt_diloco16_07_05 $G sync=diloco sync.every=16 sync.outer_momentum=0.5
run gpt_psgd $G sync=powersgd
