#!/bin/sh
# The small GPT (model=gpt: 834,304 parameters, 64-byte context) on Debian's fortunes,
# 2 CPU ranks, 2 epochs; then its loss curve. Run from the repository root.
set -e
OUT=docs/results/2026-11-26_zen1-2c_gpt-2-ranks
RUN=outputs/record-gpt-2-ranks
DDP_LAB_RUN_ID=record-gpt-2-ranks .venv/bin/torchrun --standalone --nproc_per_node=2 -m ddp_lab.train \
    model=gpt data=text optim=adamw trainer.epochs=2 trainer.log_every=10 trainer.progress=false \
    2>&1 | tee $OUT/train.log
cp $RUN/summary.json $OUT/
.venv/bin/python -m ddp_lab.bench.run_plot $RUN $OUT/loss.png --title "model=gpt data=text, 2 CPU ranks (zen1-2c)"
.venv/bin/python - "$RUN" > $OUT/loss.csv <<'PY'
import sys
from ddp_lab.bench.run_plot import scalars
data = scalars(sys.argv[1])
print("step,tag,value")
for tag in ("loss/train_step", "loss/val", "ppl/val", "token_acc/val", "perf/tokens_per_sec", "perf/mfu", "lr"):
    for step, value in data.get(tag, []):
        print(f"{step},{tag},{value:.6g}")
PY
.venv/bin/python -m ddp_lab.telemetry.provenance > $OUT/provenance.json 2>/dev/null || true
