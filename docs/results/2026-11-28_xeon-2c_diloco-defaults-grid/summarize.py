"""The grid's table from race/race.csv and race-mix/race.csv: per point, the validation loss after the 240 steps and the
steps to 2.8, median (lowest-highest) over seeds 1-3, and the loss against the defaults' run of the
same seed (the same initial weights and data order: the point's effect, not the seed's).
    python summarize.py > table.md"""
import csv
import statistics
from pathlib import Path

here = Path(__file__).parent
rows = [r for race in ("race", "race-mix") if (here / race / "race.csv").exists()  # (race-mix: run-mix.sh)
        for r in csv.DictReader(open(here / race / "race.csv"))]
points = list(dict.fromkeys(r["strategy"] for r in rows))
default = {r["seed"]: float(r["final"]) for r in rows if r["strategy"] == "diloco"}


def spread(values, spec):
    m, lo, hi = statistics.median(values), min(values), max(values)
    return f"{m:{spec}} ({lo:{spec}} to {hi:{spec}})"


print("| point | sync | bytes a step | val loss after 240 steps | - the defaults' (same seed) | steps to 2.8 |")
print("|---|---|---:|---|---|---|")
for p in points:
    runs = [r for r in rows if r["strategy"] == p]
    final = [float(r["final"]) for r in runs]
    vs = [float(r["final"]) - default[r["seed"]] for r in runs]
    steps = [float(r["steps_to_target"]) for r in runs if r["steps_to_target"]]
    print(f"| {p} | {runs[0]['sync']} | {float(runs[0]['wire_bytes_per_step']):,.0f} | {spread(final, '.4f')} | "
          f"{spread(vs, '+.4f')} | {spread(steps, '.0f') if steps else '-'} ({len(steps)}/{len(runs)} reached) |")
