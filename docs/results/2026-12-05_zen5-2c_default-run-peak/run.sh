#!/bin/sh
# What `make train` runs (lenet_fast, 2 CPU ranks, 10 epochs, today's defaults) with a picture of it, then each
# rank's peak over the whole run against the fit check's prediction, compiled and eager: LeNet 1 epoch and
# gpt_small 40 steps with 2 evaluations. From the repository root, alone (about 5 min):
#   sh docs/results/2026-12-05_zen5-2c_default-run-peak/run.sh
set -e
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=/tmp/default-run-peak
rm -rf $out; mkdir -p $out
"$py" -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train trainer.progress=false \
  hydra.run.dir=$out/run > "$here/output.txt" 2>&1
cp $out/run/summary.json "$here/summary.json"
"$py" -m ddp_lab.tools.bench.run_plot $out/run $out/run.png
"$py" -c "from PIL import Image; Image.open('$out/run.png').convert('RGB').quantize(colors=64).save('$here/run.png', optimize=True)"
GPT="model=gpt_small model.block_size=128 data=text data.batch_size=16 optim=adamw trainer.max_steps=40 trainer.eval_every_steps=20"
for c in false true; do
  "$py" -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train trainer.progress=false \
    trainer.epochs=1 trainer.compile=$c hydra.run.dir=$out/lenet-$c > $out/lenet-$c.txt 2>&1
  "$py" -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train trainer.progress=false \
    $GPT trainer.compile=$c hydra.run.dir=$out/gpt-$c > $out/gpt-$c.txt 2>&1
done
"$py" - "$out" > "$here/peaks.txt" <<'PY'
import json, sys
out = sys.argv[1]
print(f"{'run':<28} {'measured MiB by rank':>22} {'predicted MiB by rank':>22} {'measured/predicted':>18}")
for name in ("run", "lenet-false", "lenet-true", "gpt-false", "gpt-true"):
    s = json.load(open(f"{out}/{name}/summary.json"))
    m, p = s["peak_mem_mb_by_rank"], s["predicted_peak_mb_by_rank"]
    label = {"run": "make train (compiled)", "lenet-false": "LeNet 1 epoch, eager", "lenet-true": "LeNet 1 epoch, compiled",
             "gpt-false": "gpt_small 40 steps, eager", "gpt-true": "gpt_small 40 steps, compiled"}[name]
    print(f"{label:<28} {', '.join(f'{x:.0f}' for x in m):>22} {', '.join(f'{x:.0f}' for x in p):>22} "
          f"{max(a / b for a, b in zip(m, p)):>18.3f}")
PY
for name in run lenet-false lenet-true gpt-false gpt-true; do
  echo "$name: $(grep -h "memory estimate" $out/$name/rank0.log | sed 's/^.*memory estimate/memory estimate/')"
done > "$here/estimates.txt"
"$py" -c "from ddp_lab.telemetry.provenance import write_record; import json; s=json.load(open('$here/summary.json')); \
write_record('$here', 'sh docs/results/2026-12-05_zen5-2c_default-run-peak/run.sh', {'note': 'make train at today\'s defaults, then compiled and eager peaks against the fit check', 'headline': {k: s[k] for k in ('test_acc', 'samples_per_sec', 'sec_per_epoch', 'mfu', 'comm_frac')}})"
cat "$here/peaks.txt"
