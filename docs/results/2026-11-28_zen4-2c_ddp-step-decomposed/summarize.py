"""Split each run's step_ms into compute, sync wait and the rest, per rank (run.sh's runs).

    python summarize.py <folder with lo-1 .. h100-3>

From a run's TensorBoard events (tb/) when it has them, which it copies into the run's
stragglers.json (raw/ keeps those: the events themselves are not committed), else from that file.

compute and sync wait are each rank's mean over the logged windows after warm-up (steps 16-72:
the window ending at step 8 holds the untimed warm-up); the rest (data, the optimizer's step,
the loop) is step_ms minus the larger of the two ranks' compute + sync wait."""
import json
import statistics
import sys
from pathlib import Path

from ddp_lab.tools.bench.run_plot import scalars

root = Path(sys.argv[1])
rows = {}
for run in sorted(root.iterdir()):
    if not (run / "summary.json").exists():
        continue
    s = json.loads((run / "summary.json").read_text())
    if (run / "tb").is_dir():
        tb = {k: v for k, v in scalars(run).items() if k.startswith(("perf/compute_ms/", "perf/sync_wait_ms/"))}
        (run / "stragglers.json").write_text(json.dumps(tb, indent=1) + "\n")
    tb = json.loads((run / "stragglers.json").read_text())
    per_rank = []
    for r in range(2):
        c = statistics.mean(v for step, v in tb[f"perf/compute_ms/rank{r}"] if step > 8)
        w = statistics.mean(v for step, v in tb[f"perf/sync_wait_ms/rank{r}"] if step > 8)
        per_rank.append((c, w))
    step = s["step_ms"]
    rest = step - max(c + w for c, w in per_rank)
    rows[run.name] = (step, per_rank, rest)
print("| run | step ms | rank 0 compute | rank 0 sync wait | rank 1 compute | rank 1 sync wait | rest |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name, (step, pr, rest) in rows.items():
    print(f"| {name} | {step:.1f} | {pr[0][0]:.1f} | {pr[0][1]:.1f} | {pr[1][0]:.1f} | {pr[1][1]:.1f} | {rest:.1f} |")
print()
print("| where | loopback (median of 3) | 100 Mbit/s (median of 3) | grew by |")
print("|---|---:|---:|---:|")
for label, f in [("step", lambda t: t[0]),
                 ("compute (mean of ranks)", lambda t: statistics.mean(c for c, _ in t[1])),
                 ("sync wait, the rank that waited less", lambda t: min(w for _, w in t[1])),
                 ("sync wait, the rank that waited more", lambda t: max(w for _, w in t[1])),
                 ("rest", lambda t: t[2])]:
    lo = statistics.median(f(t) for n, t in rows.items() if n.startswith("lo-"))
    hi = statistics.median(f(t) for n, t in rows.items() if n.startswith("h100-"))
    print(f"| {label} | {lo:.1f} | {hi:.1f} | {hi - lo:+.1f} |")
