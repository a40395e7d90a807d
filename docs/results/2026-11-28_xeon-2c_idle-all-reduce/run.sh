#!/bin/sh
# Is an all-reduce slower after an idle gap, and is TCP's slow start after idle the cause?
# 2 emulated hosts, 100 Mbit/s links; gloo's ring all-reduce of LeNet's gradients (516,272 bytes)
# and the small GPT's (3,337,216), after idle gaps of 0, 0.1, 0.3 and 1 s (10 timed each), with
# net.ipv4.tcp_slow_start_after_idle at 1 (Linux's default) and at 0, set in each host's namespace.
# Usage (from the repository root, as root): [VENV=path/to/venv] sh docs/results/2026-11-28_xeon-2c_idle-all-reduce/run.sh
set -e
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
"$py" -m ddp_lab.cluster down --name idle 2>/dev/null || true
"$py" -m ddp_lab.cluster up --name idle --hosts 2 --rate 100mbit | tee "$here/cluster.txt"
for ssai in 1 0 1 0; do
  for h in idle-0 idle-1; do "$py" -m ddp_lab.cluster exec --name idle $h -- sysctl -q -w net.ipv4.tcp_slow_start_after_idle=$ssai; done
  echo "tcp_slow_start_after_idle=$ssai" | tee -a "$here/runs.txt"
  "$py" -m ddp_lab.cluster run --name idle -- "$here/gapped.py" 516272,3337216 0,0.1,0.3,1 10 2>&1 \
    | grep '^\[.*bytes\|^bytes' | tee -a "$here/runs.txt"
done
# Then beside computation (contended.py): alone, right after, and during matrix products on the
# host's core, at the default slow start after idle (1).
for h in idle-0 idle-1; do "$py" -m ddp_lab.cluster exec --name idle $h -- sysctl -q -w net.ipv4.tcp_slow_start_after_idle=1; done
for arg in "516272 0.1" "3337216 0.25"; do
  "$py" -m ddp_lab.cluster run --name idle -- "$here/contended.py" $arg 10 2>&1 \
    | grep '^\[.*bytes\|^bytes' | tee -a "$here/contended.txt"
done
"$py" -m ddp_lab.cluster down --name idle
