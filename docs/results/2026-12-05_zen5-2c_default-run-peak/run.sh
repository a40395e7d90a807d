#!/bin/sh
# What `make train` runs (lenet_fast, 2 CPU ranks, 10 epochs, today's defaults) with a picture of it, then each
# rank's peak over the whole run against the fit check's prediction, compiled and eager: LeNet 1 epoch and
# gpt_small 40 steps with 2 evaluations (6 and 12 layers), ResNet-18 12 steps with 2. From the repository root,
# alone (about 10 min):
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
RESNET="model=resnet18 data.batch_size=64 trainer.max_steps=12 trainer.eval_every_steps=6"
train() {  # name overrides...
  name=$1; shift
  "$py" -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train trainer.progress=false "$@" \
    hydra.run.dir=$out/$name > $out/$name.txt 2>&1
}
for c in false true; do
  train lenet-$c trainer.epochs=1 trainer.compile=$c
  train gpt-$c $GPT trainer.compile=$c
  train gpt12-$c $GPT model.n_layer=12 trainer.compile=$c
  train resnet18-$c $RESNET trainer.compile=$c
done
"$py" - "$out" > "$here/peaks.txt" <<'PY'
import json, sys
out = sys.argv[1]
print(f"{'run':<28} {'measured MiB by rank':>22} {'predicted MiB by rank':>22} {'measured/predicted':>18}")
for name in ("run", "lenet-false", "lenet-true", "gpt-false", "gpt-true", "gpt12-false", "gpt12-true",
             "resnet18-false", "resnet18-true"):
    s = json.load(open(f"{out}/{name}/summary.json"))
    m, p = s["peak_mem_mb_by_rank"], s["predicted_peak_mb_by_rank"]
    label = {"run": "make train (compiled)", "lenet-false": "LeNet 1 epoch, eager", "lenet-true": "LeNet 1 epoch, compiled",
             "gpt-false": "gpt_small 40 steps, eager", "gpt-true": "gpt_small 40 steps, compiled",
             "gpt12-false": "the same, 12 layers, eager", "gpt12-true": "the same, 12 layers, compiled",
             "resnet18-false": "ResNet-18 12 steps, eager", "resnet18-true": "ResNet-18 12 steps, compiled"}[name]
    print(f"{label:<28} {', '.join(f'{x:.0f}' for x in m):>22} {', '.join(f'{x:.0f}' for x in p):>22} "
          f"{max(a / b for a, b in zip(m, p)):>18.3f}")
PY
for name in run lenet-false lenet-true gpt-false gpt-true gpt12-false gpt12-true resnet18-false resnet18-true; do
  echo "$name: $(grep -h "memory estimate" $out/$name/rank0.log | sed 's/^.*memory estimate/memory estimate/')"
done > "$here/estimates.txt"
"$py" -c "from ddp_lab.telemetry.provenance import write_record; import json; s=json.load(open('$here/summary.json')); \
write_record('$here', 'sh docs/results/2026-12-05_zen5-2c_default-run-peak/run.sh', {'note': 'make train at today\'s defaults, then compiled and eager peaks against the fit check', 'headline': {k: s[k] for k in ('test_acc', 'samples_per_sec', 'sec_per_epoch', 'mfu', 'comm_frac')}})"
cat "$here/peaks.txt"
