"""The 2-host race's predictions again, with the pricing of DiLoCo's sync.overlap that came after
it ran (ddp_lab.costmodel.strategies: only what the outer all-reduce takes beyond TAU loopback
steps is added). Writes 2h-40mbit/repriced.md. From the repository root:
    python docs/results/2026-11-28_xeon-2c_race-gpt-network-bound/repriced.py"""
import csv
import statistics
from pathlib import Path

from ddp_lab.tools.costmodel.strategies import predict_rows

R = Path(__file__).parent
rows = [{"strategy": r["strategy"], "seed": int(r["seed"]), "world_size": int(r["world_size"]),
         "time_to_target_s": float(r["time_to_target_s"]), "before": float(r["predicted_time_to_target_s"])}
        for r in csv.DictReader(open(R / "2h-40mbit" / "race.csv"))]
predict_rows(rows, R / "fit-2h-40mbit.csv", R / "loopback-2" / "race.csv")
lines = ["| strategy | seed | measured s | predicted s, as raced | predicted s, now | error now |",
         "|---|---:|---:|---:|---:|---:|"]
for r in rows:
    lines.append(f"| {r['strategy']} | {r['seed']} | {r['time_to_target_s']:.1f} | {r['before']:.1f} | "
                 f"{r['predicted_time_to_target_s']:.1f} | {r['prediction_error']:+.0%} |")
lines += ["", "| strategy | median error now (lowest-highest) |", "|---|---:|"]
for name in dict.fromkeys(r["strategy"] for r in rows):
    e = [r["prediction_error"] for r in rows if r["strategy"] == name]
    lines.append(f"| {name} | {statistics.median(e):+.0%} ({min(e):+.0%}-{max(e):+.0%}) |")
(R / "2h-40mbit" / "repriced.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
