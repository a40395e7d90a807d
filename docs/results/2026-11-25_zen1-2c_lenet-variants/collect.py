"""Tabulate raw/: per variant the run's images/s (summary.json samples_per_sec, the
whole measured window) and epoch 2's (TensorBoard perf/samples_per_sec), medians over
rounds, and per round lenet_fast over lenet. Usage: python collect.py > summary.md"""
import json
import statistics
from collections import defaultdict
from pathlib import Path

RAW = Path(__file__).resolve().parent / "raw"
VARIANTS = {
    "lenet_eager": "model=lenet, eager",
    "fast_eager": "model=lenet_fast, eager",
    "lenet_compiled": "model=lenet, compiled",
    "fast_compiled": "model=lenet_fast (padded), compiled",
    "fastcrop_compiled": "model=lenet_fast model.pad_channels_to=0, compiled",
}
run, ep2, acc = defaultdict(dict), defaultdict(dict), defaultdict(dict)
for f in sorted(RAW.glob("r*_*.summary.json")):
    rnd, variant = f.name.removesuffix(".summary.json").split("_", 1)
    rnd = int(rnd[1:])
    summary = json.loads(f.read_text())
    epochs = json.loads(f.with_name(f.name.replace(".summary.", ".epochs.")).read_text())
    run[variant][rnd] = summary["samples_per_sec"]
    ep2[variant][rnd] = epochs["perf/samples_per_sec"][-1]
    acc[variant][rnd] = summary["test_acc"]

print("| variant | rounds | images/s, run (median) | min | max | images/s, epoch 2 (median) | min | max | test acc |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for v, label in VARIANTS.items():
    if not run[v]:
        continue
    r, e = list(run[v].values()), list(ep2[v].values())
    print(f"| {label} | {len(r)} | {statistics.median(r):,.0f} | {min(r):,.0f} | {max(r):,.0f} | "
          f"{statistics.median(e):,.0f} | {min(e):,.0f} | {max(e):,.0f} | "
          f"{', '.join(sorted({f'{a:.4f}' for a in acc[v].values()}))} |")
print()
for fast, plain in (("fast_eager", "lenet_eager"), ("fast_compiled", "lenet_compiled"),
                    ("fastcrop_compiled", "lenet_compiled"), ("fast_compiled", "fastcrop_compiled"),
                    ("lenet_compiled", "lenet_eager"), ("fast_compiled", "fast_eager")):
    rounds = sorted(set(run[fast]) & set(run[plain]))
    if not rounds:
        continue
    per_run = [run[fast][i] / run[plain][i] for i in rounds]
    per_ep2 = [ep2[fast][i] / ep2[plain][i] for i in rounds]
    print(f"- {VARIANTS[fast]} / {VARIANTS[plain]}, per round: run "
          f"{', '.join(f'{x:.2f}' for x in per_run)} (median {statistics.median(per_run):.2f}); "
          f"epoch 2 {', '.join(f'{x:.2f}' for x in per_ep2)} (median {statistics.median(per_ep2):.2f})")
