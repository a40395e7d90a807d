#!/usr/bin/env bash
# The CPU training step before and after "the step does only the step" and opt-in
# machine tuning: 2 ranks of LeNet (lenet_fast, eager) on Fashion-MNIST, 2 epochs,
# three launches alternated per round, 3 rounds. Run from the repository root:
#   bash docs/results/2026-11-26_zen1-2c_step-before-after/run.sh BEFORE_COMMIT AFTER_COMMIT DATA_ROOT
# before:        BEFORE_COMMIT with its defaults (dist.comm_threads=auto: real-time gloo threads here)
# before-normal: BEFORE_COMMIT with dist.comm_threads=normal (the new default, old step)
# after:         AFTER_COMMIT with its defaults
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
before=$1 after=$2 data=$3
py=$PWD/.venv/bin/python
for c in "$before" "$after"; do
  [ -d "/tmp/step-ab-$c" ] || git worktree add -f "/tmp/step-ab-$c" "$c" >/dev/null
  # each tree's own configs as ddp_lab.conf (an editable install maps it to the checkout's)
  ln -sfn ../conf "/tmp/step-ab-$c/ddp_lab/conf"
done
args="data.root=$data trainer.epochs=2 trainer.compile=false trainer.progress=false trainer.keep_ckpts=0"
: > "$here/runs.csv"
echo "round,variant,commit,samples_per_sec,step_ms,comm_threads,test_acc" >> "$here/runs.csv"
for round in 1 2 3; do
  for variant in before before-normal after; do
    commit=$before; extra=""
    [ "$variant" = after ] && commit=$after
    [ "$variant" = before-normal ] && extra="dist.comm_threads=normal"
    dir=$here/runs/$variant-$round
    rm -rf "$dir"; mkdir -p "$here/runs"
    (cd "/tmp/step-ab-$commit" && "$py" -m torch.distributed.run --standalone --nproc_per_node=2 \
       -m ddp_lab.train $args $extra hydra.run.dir="$dir" > "$dir.out" 2>&1)
    "$py" - "$dir" "$round" "$variant" "$commit" >> "$here/runs.csv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
print(f"{sys.argv[2]},{sys.argv[3]},{sys.argv[4]},{s['samples_per_sec']:.1f},{s['step_ms']:.3f},"
      f"{s['comm_threads']},{s['test_acc']:.4f}")
PY
    tail -1 "$here/runs.csv"
    # keep what the table needs: the summary and rank 0's log
    find "$dir" -mindepth 1 -maxdepth 1 ! -name summary.json ! -name rank0.log -exec rm -rf {} +
  done
done
