"""The record's table from runs.txt: wall seconds by mode, median (range) over the rounds, and the cost of the
lost host against each mode's control. Usage: python table.py runs.txt"""
import re
import statistics
import sys

walls, absent = {}, {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+) kill=(\d) rep=(\d+): rc (\d+), ([\d.]+) s wall", line)
    if not m or m.group(4) != "0":
        continue
    walls.setdefault((m.group(1), m.group(2)), []).append(float(m.group(5)))
    gone = re.search(r"\{'islands': 2, 'step': (\d+)\}, \{'islands': 3, 'step': (\d+)\}", line)
    if gone:
        absent.setdefault(m.group(1), []).append(int(gone.group(2)) - int(gone.group(1)))
print("| mode | no loss: wall s | host 2 lost: wall s | cost of the loss, s (median of the pairs) |")
print("|---|---:|---:|---:|")
for mode in ("torchft", "restart"):
    ctrl, lost = walls.get((mode, "0"), []), walls.get((mode, "1"), [])
    pairs = [b - a for a, b in zip(ctrl, lost)]
    fmt = lambda xs: f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})" if xs else "-"  # noqa: E731
    print(f"| {mode} | {fmt(ctrl)} | {fmt(lost)} | {fmt(pairs)} |")
if absent.get("torchft"):
    print(f"\ntorchft: host 2 away for {absent['torchft']} steps of 800 (its part of the data skipped meanwhile)")
