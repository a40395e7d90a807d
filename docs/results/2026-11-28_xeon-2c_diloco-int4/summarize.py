"""The table of README.md from runs.txt: per sync.compress the held-out loss after 200 steps (median and
range of 3 seeds), its difference from fp32's on the same seed, the bytes per step and their ratio."""
import statistics
import sys
from pathlib import Path

here = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
runs: dict = {}
for line in (here / "runs.txt").read_text().splitlines():
    f = line.split()
    runs[f[0], f[1]] = (float(f[f.index("val_loss") + 1]), float(f[f.index("wire_bytes_per_step") + 1]),
                        float(f[f.index("step_ms") + 1]))
seeds = sorted({s for _, s in runs})
print("| outer gradients | held-out loss, median (range) of 3 seeds | - fp32's, same seed: median (range) "
      "| bytes per step | fp32's / these |")
print("|---|---|---|---:|---:|")
for c in ("none", "int8", "int4"):
    loss = [runs[c, s][0] for s in seeds]
    diff = [runs[c, s][0] - runs["none", s][0] for s in seeds]
    sent = runs[c, seeds[0]][1]
    print(f"| {c} | {statistics.median(loss):.4f} ({min(loss):.4f}-{max(loss):.4f}) | "
          f"{statistics.median(diff):+.4f} ({min(diff):+.4f} to {max(diff):+.4f}) | {sent:,.0f} | "
          f"{runs['none', seeds[0]][1] / sent:.2f} |")
