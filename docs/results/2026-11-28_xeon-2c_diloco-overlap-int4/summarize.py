"""table.md from runs.txt: per place and configuration the median step time of the 3 repeats, its range,
its ratio to loopback's median and, repeat by repeat, to the same repeat's loopback run; the bytes a step
and the validation loss after 72 steps.
    python summarize.py [FOLDER [CONFIG ...]]   # CONFIG: loopback's, then the hosts' ones, in order
"""
import statistics
import sys
from pathlib import Path

here = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
configs = sys.argv[2:] or ["int4-overlap0", "int4-overlap0", "int4-overlap4", "fp32-overlap4"]
keys = [("loopback", configs[0])] + [("hosts", c) for c in configs[1:]]
runs: dict = {}
for line in (here / "runs.txt").read_text().splitlines():
    f = line.split()
    if "step_ms" in f:
        runs.setdefault((f[0], f[1]), {})[f[2]] = (float(f[f.index("step_ms") + 1]),
                                                   float(f[f.index("wire_bytes_per_step") + 1]),
                                                   float(f[f.index("val_loss") + 1]))
loop = runs[keys[0]]
print("| where | sync | step ms, median (range) of 3 | / loopback's | / loopback's, repeat by repeat | "
      "bytes a step | val loss after 72 steps (range) |")
print("|---|---|---|---:|---|---:|---|")
for key in keys:
    got = runs[key]
    ms = [v[0] for v in got.values()]
    ratios = [got[k][0] / loop[k][0] for k in got]
    loss = [v[2] for v in got.values()]
    med = statistics.median(ms)
    print(f"| {key[0]} | {key[1]} | {med:.1f} ({min(ms):.1f}-{max(ms):.1f}) | "
          f"{med / statistics.median(v[0] for v in loop.values()):.2f} | "
          f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | "
          f"{statistics.median(v[1] for v in got.values()):,.0f} | {statistics.median(loss):.4f} "
          f"({min(loss):.4f}-{max(loss):.4f}) |")
