#!/bin/sh
# What one lost host costs: LeNet on Fashion-MNIST, DiLoCo across 3 emulated hosts (one rank each, 200 Mbit/s,
# sync.every=4, 800 steps, a checkpoint every 50), host 2 SIGKILLed (`cluster kill`) KILL_S seconds after the
# launch and started again DELAY_S seconds after that:
#   torchft   sync.fault_tolerance=torchft: the others go on; `cluster run --rejoin-after-s DELAY_S` starts host 2
#             again, which resumes its own checkpoint and is healed from a peer
#   restart   the islands job as before (a fixed set of hosts): it fails, and is launched again DELAY_S seconds
#             later with trainer.resume=auto, every host from its newest checkpoint (as a scheduler would)
# and both without the kill (the controls). Wall time from the first launch to the last exit; REPS rounds,
# the four runs interleaved in each. Appends to runs.txt.
# Usage (from the repository root, as root): [VENV=.venv] [REPS=3] [KILL_S=15] [DELAY_S=3] sh <this folder>/run.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
out=$(mktemp -d /tmp/lostcost.XXXX)
kill_s=${KILL_S:-15} delay_s=${DELAY_S:-3}
common="-m ddp_lab.train sync=diloco sync.islands=host sync.every=4 trainer.max_steps=800 trainer.ckpt_every_steps=50
  trainer.eval_every_steps=800 data.batch_size=384 trainer.progress=false dist.timeout_s=60"
ft="sync.fault_tolerance=torchft sync.max_islands=3 sync.island_timeout_s=10"
cluster() { sub=$1; shift; "$py" -m ddp_lab.tools.cluster "$sub" --name lost "$@"; }
run() {  # mode kill(0|1) rep
  mode=$1 kill=$2 rep=$3 dir="$out/$1-$2-$3"
  start=$(date +%s.%N)
  if [ "$kill" = 1 ]; then (sleep "$kill_s"; cluster kill lost-2 > /dev/null) & fi
  if [ "$mode" = torchft ]; then
    cluster run --rejoin-after-s "$delay_s" -- $common $ft "hydra.run.dir=$dir/island\${oc.env:DDP_LAB_ISLAND}" \
      > "$dir.log" 2>&1
    rc=$?
  else
    cluster run --run-id "restart-$kill-$rep" -- $common "hydra.run.dir=$dir" > "$dir.log" 2>&1
    rc=$?
    if [ "$rc" != 0 ]; then
      sleep "$delay_s"
      cluster run --run-id "restart-$kill-$rep-again" -- $common "hydra.run.dir=$dir" trainer.resume=auto \
        >> "$dir.log" 2>&1
      rc=$?
    fi
  fi
  wait
  end=$(date +%s.%N)
  "$py" - "$dir" "$mode" "$kill" "$rep" "$start" "$end" "$rc" <<'PY' | tee -a "$here/runs.txt"
import json, pathlib, sys
d, mode, kill, rep, start, end, rc = sys.argv[1:]
found = sorted(pathlib.Path(d).glob("**/summary.json"))
s = [json.loads(p.read_text()) for p in found]
print(f"{mode} kill={kill} rep={rep}: rc {rc}, {float(end) - float(start):.1f} s wall, steps "
      f"{[x['steps'] for x in s]}, test acc {[x.get('test_acc') for x in s]}, restarts "
      f"{[x['restarts_by_rank'] for x in s]}, membership {[x.get('membership') for x in s][:1]}, "
      f"rounds dropped {[x.get('rounds_dropped') for x in s]}")
PY
  grep -h "islands present\|not committed\|rejoined\|resumed from\|joins run\|error" "$dir.log" | cut -c1-160 \
    | sed "s|^|    |" >> "$here/runs-lines.txt"
}
cluster down > /dev/null 2>&1
cluster up --hosts 3 --rate 200mbit > "$here/cluster.txt"
for rep in $(seq 1 "${REPS:-3}"); do
  for m in "torchft 1" "restart 1" "torchft 0" "restart 0"; do run $m "$rep"; done
done
cluster down > /dev/null
rm -rf "$out"
