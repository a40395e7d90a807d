#!/bin/sh
# Each rank's DataLoader workers (data.loader=dataloader data.num_workers=2: 4 processes a rank), their private
# memory as summary.json measures it against what the fit check priced: Fashion-MNIST with LeNet (2 epochs),
# text with gpt_small (40 steps), and a dataset of Python objects (points.py: 1M spiral points, examples/spirals'
# MLP, 1 and 3 epochs). 2 ranks. From the repository root, alone (about 4 min):
#   sh docs/results/2026-12-05_zen5-2c_loader-workers-memory/run.sh
set -e
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=/tmp/loader-workers-memory
rm -rf $out; mkdir -p $out
W="data.loader=dataloader data.num_workers=2 trainer.progress=false"
train() {  # name overrides...
  name=$1; shift
  PYTHONPATH=$here:examples/spirals "$py" -m torch.distributed.run --standalone --nproc_per_node=2 -m ddp_lab.train \
    "$@" hydra.run.dir=$out/$name > $out/$name.txt 2>&1
}
train lenet $W trainer.epochs=2
train gpt $W model=gpt_small model.block_size=128 data=text data.batch_size=16 optim=adamw trainer.max_steps=40 \
  trainer.eval_every_steps=20
# (Hydra takes --config-dir before the overrides; the MLP is examples/spirals')
POINTS="--config-dir $here/conf model=mlp data=points optim=adamw"
train points-1 $POINTS $W trainer.epochs=1
train points-3 $POINTS $W trainer.epochs=3
"$py" - "$out" > "$here/workers.txt" <<'PY'
import json, sys
out = sys.argv[1]
print(f"{'run':<34} {'workers measured MiB':>22} {'priced MiB':>12} {'measured/priced':>16} {'rank peak/predicted':>20}")
for name, label in (("lenet", "LeNet, Fashion-MNIST, 2 epochs"), ("gpt", "gpt_small, text, 40 steps"),
                    ("points-1", "Python objects, 1 epoch"), ("points-3", "Python objects, 3 epochs")):
    s = json.load(open(f"{out}/{name}/summary.json"))
    m, p = s["loader_workers_mb_by_rank"], s["predicted_workers_mb_by_rank"]
    peak = max(a / b for a, b in zip(s["peak_mem_mb_by_rank"], s["predicted_peak_mb_by_rank"]))
    print(f"{label:<34} {', '.join(f'{x:.0f}' for x in m):>22} {', '.join(f'{x:.0f}' for x in p):>12} "
          f"{max(a / b for a, b in zip(m, p)):>16.3f} {peak:>20.3f}")
PY
# each rank with its workers (the two measured maxima summed: at most what the host held) against the check's
"$py" - "$out" > "$here/hosts.txt" <<'PY'
import json, sys
out = sys.argv[1]
print(f"{'run':<10} {'rank + its workers MiB, measured':>34} {'predicted':>18} {'measured/predicted':>19}")
for name in ("lenet", "gpt", "points-1", "points-3"):
    s = json.load(open(f"{out}/{name}/summary.json"))
    m = [a + b for a, b in zip(s["peak_mem_mb_by_rank"], s["loader_workers_mb_by_rank"])]
    p = [a + b for a, b in zip(s["predicted_peak_mb_by_rank"], s["predicted_workers_mb_by_rank"])]
    print(f"{name:<10} {', '.join(f'{x:.1f}' for x in m):>34} {', '.join(f'{x:.1f}' for x in p):>18} "
          f"{max(a / b for a, b in zip(m, p)):>19.3f}")
PY
for name in lenet gpt points-1 points-3; do
  echo "$name: $(grep -h "worker processes" $out/$name/rank0.log | sed 's/^.*memory estimate/memory estimate/')"
done > "$here/estimates.txt"
"$py" -c "from ddp_lab.telemetry.provenance import write_record; write_record('$here', \
'sh docs/results/2026-12-05_zen5-2c_loader-workers-memory/run.sh', {'note': 'DataLoader workers: measured private \
memory against the fit check price'})"
cat "$here/workers.txt"
