"""The table of README.md from runs.txt: per place and overlap the median step time of 3 repeats, its
range, and its ratio to the loopback median; the held-out loss after the 72 steps."""
import statistics
import sys
from pathlib import Path

here = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
runs: dict = {}
for line in (here / "runs.txt").read_text().splitlines():
    f = line.split()
    runs.setdefault((f[0], f[1]), []).append((float(f[f.index("step_ms") + 1]), float(f[f.index("val_loss") + 1])))
base = statistics.median(ms for ms, _ in runs["loopback", "overlap0"])
print("| where | sync.overlap | step ms, median (range) of 3 | / loopback's | held-out loss |")
print("|---|---:|---|---:|---:|")
for place, name in (("loopback", "overlap0"), ("hosts", "overlap0"), ("hosts", "overlap4")):
    ms = [m for m, _ in runs[place, name]]
    losses = sorted({v for _, v in runs[place, name]})
    med = statistics.median(ms)
    print(f"| {place} | {name[7:]} | {med:,.1f} ({min(ms):,.1f}-{max(ms):,.1f}) | {med / base:.2f} | "
          f"{', '.join(f'{v:.4f}' for v in losses)} |")
