"""The grid's table: per recipe, dtype and length, how many seeds ran, diverged, and test accuracy's median
(min-max); from run.sh's log lines (cut.txt, whole.txt: the return code says a divergence) and summaries.csv
(every run's summary.json, a row each).
Usage (from this folder): python3 summarize.py"""
import csv
import re
import statistics
from collections import defaultdict
from pathlib import Path

here = Path(__file__).parent
summaries = {r["file"]: r for r in csv.DictReader((here / "summaries.csv").open())}
runs = defaultdict(list)  # (epochs, recipe, amp) -> [(seed, rc, acc or None, sec/epoch or None)]
for log in ("cut.txt", "whole.txt"):
    if not (here / log).exists():
        continue
    for line in (here / log).read_text().splitlines():
        m = re.match(r"epochs (\d+) seed (\d+) amp (\w+) (\S+) rc (\d+)", line)
        if not m:
            continue
        e, s, amp, recipe, rc = m.groups()
        summary = summaries.get(f"e{e}-s{s}-{amp}-{recipe}.summary.json", {}) if rc == "0" else {}
        acc, sec = (float(summary[k]) if summary.get(k) else None for k in ("test_acc", "sec_per_epoch"))
        runs[int(e), recipe, amp].append((int(s), int(rc), acc, sec))
print("| epochs | recipe | amp | seeds | diverged | test acc median (min-max) | sec/epoch median |")
print("|---:|---|---|---:|---:|---|---:|")
for (e, recipe, amp), rows in sorted(runs.items()):
    accs = [a for _, rc, a, _ in rows if a is not None]
    secs = [t for *_, t in rows if t is not None]
    bad = [s for s, rc, _, _ in rows if rc != 0]
    acc = f"{statistics.median(accs):.4f} ({min(accs):.4f}-{max(accs):.4f})" if accs else "-"
    sec = f"{statistics.median(secs):.1f}" if secs else "-"
    print(f"| {e} | {recipe} | {amp} | {len(rows)} | {len(bad)}{' (seeds ' + ', '.join(map(str, bad)) + ')' if bad else ''} "
          f"| {acc} | {sec} |")
