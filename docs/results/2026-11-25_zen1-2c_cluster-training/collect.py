"""The four bench.scaling runs of this record as one table (table.md), from their scaling.csv."""
import csv
from pathlib import Path

HERE = Path(__file__).resolve().parent


def fmt(v, spec):
    return "-" if v in ("", None) else format(float(v), spec)


lines = ["| link | sync.compress | hosts | images/s | efficiency | comm share | step ms | predicted ms | MFU |",
         "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
for rate in ("100mbit", "1gbit"):
    for compress in ("none", "bf16"):
        with open(HERE / f"lenet-{rate}-{compress}" / "scaling.csv", newline="") as f:
            for r in csv.DictReader(f):
                lines.append(f"| {rate} | {compress} | {r['world_size']} | {fmt(r['samples_per_sec'], ',.0f')} | "
                             f"{fmt(r['efficiency'], '.0%')} | {fmt(r['comm_frac'], '.0%')} | "
                             f"{fmt(r['step_ms'], '.1f')} | {fmt(r['predicted_step_ms'], '.1f')} | "
                             f"{fmt(r['mfu'], '.1%')} |")
lines += ["", "| model | link | hosts | images/s | efficiency | comm share | step ms | predicted ms | MFU |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
for rate in ("100mbit", "1gbit"):
    with open(HERE / f"resnet18-{rate}" / "scaling.csv", newline="") as f:
        for r in csv.DictReader(f):
            lines.append(f"| resnet18 | {rate} | {r['world_size']} | {fmt(r['samples_per_sec'], ',.1f')} | "
                         f"{fmt(r['efficiency'], '.0%')} | {fmt(r['comm_frac'], '.0%')} | "
                         f"{fmt(r['step_ms'], '.0f')} | {fmt(r['predicted_step_ms'], '.0f')} | {fmt(r['mfu'], '.1%')} |")
(HERE / "table.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
