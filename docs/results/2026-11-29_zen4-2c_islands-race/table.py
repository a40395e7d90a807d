"""The record's tables from its race.csv files: the headline race (2x2-20mbit/ with 1x2/'s DDP on one host)
and the loopback race at equal steps (loopback-4/).
    python table.py <this folder>"""
import csv
import statistics
import sys
from pathlib import Path

R = Path(sys.argv[1])


def rows(name):
    with open(R / name / "race.csv", newline="") as f:
        return list(csv.DictReader(f))


def spread(values, spec, scale=1.0):
    v = [float(x) * scale for x in values if x not in (None, "")]
    if not v:
        return "-"
    m, lo, hi = statistics.median(v), min(v), max(v)
    return f"{m:{spec}} ({lo:{spec}}-{hi:{spec}})" if lo != hi else f"{m:{spec}}"


def by(rs):
    out = {}
    for r in rs:
        out.setdefault(r["strategy"], []).append(r)
    return out


race, one = rows("2x2-20mbit"), rows("1x2")
ddp = {r["seed"]: float(r["time_to_target_s"]) for r in race if r["strategy"] == "ddp" and r["time_to_target_s"]}
print("| strategy | sync | s to target | x flat DDP | steps to target | step ms | MB/step across islands | "
      "MB/step in all | predicted s | error |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for name, rs in list(by(race).items()) + [("ddp, one host of 2 ranks", one)]:
    vs = [float(r["time_to_target_s"]) / ddp[r["seed"]] for r in rs if r["time_to_target_s"] and r["seed"] in ddp]
    print(f"| {name} | {rs[0]['sync']} | {spread([r['time_to_target_s'] for r in rs], '.1f')} | "
          f"{spread(vs, '.3f')} | {spread([r['steps_to_target'] for r in rs], '.0f')} | "
          f"{spread([r['step_ms'] for r in rs], '.0f')} | "
          f"{spread([r.get('wire_bytes_across_per_step') for r in rs], '.3f', 1e-6)} | "
          f"{spread([r['wire_bytes_per_step'] for r in rs], '.3f', 1e-6)} | "
          f"{spread([r.get('predicted_time_to_target_s') for r in rs], '.1f')} | "
          f"{spread([r.get('prediction_error') for r in rs], '+.0%')} |")
print()
print("| strategy (loopback, 4 ranks) | sync | steps to target | val loss at 168 steps | step ms |")
print("|---|---|---:|---:|---:|")
for name, rs in by(rows("loopback-4")).items():
    print(f"| {name} | {rs[0]['sync']} | {spread([r['steps_to_target'] for r in rs], '.0f')} | "
          f"{spread([r['final'] for r in rs], '.4f')} | {spread([r['step_ms'] for r in rs], '.0f')} |")
