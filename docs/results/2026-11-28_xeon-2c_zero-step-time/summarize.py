"""The table of README.md from runs.txt and the prediction files: per place and strategy the median
step time of the 3 repeats, its range, its ratio to DDP's median, and (emulated hosts) the cost
model's price for the collectives the run used (torch's on gloo, or ours: "-ours")."""
import statistics
import sys
from pathlib import Path

here = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
runs: dict = {}
for line in (here / "runs.txt").read_text().splitlines():
    f = line.split()
    if f[0] in ("hosts", "loopback") and "step_ms" in f:
        runs.setdefault((f[0], f[1]), []).append(float(f[f.index("step_ms") + 1]))
predicted = {}
for algo, suffix in (("builtin", ""), ("ring_textbook", "-ours")):
    for line in (here / f"prediction-{algo}.txt").read_text().splitlines():
        f = line.split()
        if f and f[0] in ("ddp", "zero1", "zero2", "zero3") and len(f) >= 7:
            predicted[f[0] + suffix] = float(f[6])
predicted["zero3-noprefetch"] = predicted["fsdp"] = predicted["zero3"]
print("| where | sync | step ms, median (range) of 3 | / DDP's | cost model's ms | error |")
print("|---|---|---|---:|---:|---:|")
for place in ("hosts", "loopback"):
    ddp = statistics.median(runs[place, "ddp"])
    for s in ("ddp", "zero1", "zero1-ours", "zero2", "zero2-ours", "zero3", "zero3-noprefetch", "fsdp"):
        ms = runs.get((place, s), [])
        if not ms:
            continue
        med = statistics.median(ms)
        p = predicted.get(s) if place == "hosts" else None
        err = f"{(p - med) / med:+.0%}" if p else "-"
        print(f"| {place} | {s} | {med:,.1f} ({min(ms):,.1f}-{max(ms):,.1f}) | {med / ddp:.2f} | "
              f"{f'{p:,.1f}' if p else '-'} | {err} |")
