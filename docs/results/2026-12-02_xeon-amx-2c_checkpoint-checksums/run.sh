#!/bin/sh
# From the repository root: 3 repeats, before and after interleaved; before = a88b709 (the commit before
# 404aa26, which moved the checksums to each rank), after = 404aa26.
set -e
HERE=docs/results/2026-12-02_xeon-amx-2c_checkpoint-checksums
rm -rf /tmp/ckpt-before && git worktree add -f /tmp/ckpt-before a88b709 >/dev/null 2>&1
for i in 1 2 3; do
  for which in before after; do
    rm -rf /tmp/ckpt-bench
    if [ $which = before ]; then src=/tmp/ckpt-before; else src=$PWD; fi
    PYTHONPATH=$src OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node=8 $HERE/bench.py \
      --root /tmp/ckpt-bench --mib 576 2>/dev/null | tee -a $HERE/runs.txt
  done
done
rm -rf /tmp/ckpt-bench
git worktree remove --force /tmp/ckpt-before
