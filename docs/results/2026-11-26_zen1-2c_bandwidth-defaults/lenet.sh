#!/bin/bash
# DiLoCo / local SGD defaults on loopback: LeNet, 2 ranks, 2 epochs, test acc
run() { name=$1; shift; DDP_LAB_RUN_ID=$name timeout 600 /work/main/.venv/bin/torchrun --standalone --nproc_per_node=2 -m ddp_lab.train trainer.epochs=2 trainer.keep_ckpts=0 trainer.progress=false "$@" > $name.out 2>&1; echo "$name $(python3 -c "import json;s=json.load(open('outputs/$name/summary.json'));print(s['test_acc'], s['train_loss'], s['wire_bytes_per_step'])" 2>/dev/null || echo FAIL)"; }
run ddp sync=ddp
run local8 sync=local_sgd sync.every=8
run diloco8_07_09 sync=diloco sync.every=8
run diloco8_10_05 sync=diloco sync.every=8 sync.outer_lr=1.0 sync.outer_momentum=0.5
run diloco8_07_05 sync=diloco sync.every=8 sync.outer_lr=0.7 sync.outer_momentum=0.5
run diloco8_10_00 sync=diloco sync.every=8 sync.outer_lr=1.0 sync.outer_momentum=0.0
run psgd sync=powersgd sync.powersgd_start_step=50
