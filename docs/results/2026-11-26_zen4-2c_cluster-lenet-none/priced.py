"""This record's host points priced with both fits: the all-sizes fits bench.scaling used (the bf16
record's costmodel-<rate>-all-sizes/, 2-3 host sweeps from 64 KiB) and the Zen 4 cluster record's fits
from 1 MiB, which the bf16 record found over-price a gradient below 1 MiB (LeNet's: 516 KB in fp32).

    python docs/results/2026-11-26_zen4-2c_cluster-lenet-none/priced.py > priced.md
"""
import csv
from pathlib import Path

from ddp_lab.costmodel.step_time import allreduce_ms, load_fit, loopback_steps

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent
loop = loopback_steps(HERE / "lenet-loopback-none" / "scaling.csv")
print("| link | hosts | measured ms | all-sizes fit ms | from-1-MiB fit ms | all-reduce: all sizes / from 1 MiB |")
print("|---|---:|---:|---:|---:|---:|")
for rate in ("1gbit", "100mbit"):
    fits = [load_fit(RESULTS / "2026-11-26_zen4-2c_cluster-lenet-predictions" / f"costmodel-{rate}-all-sizes" / "fit.csv"),
            load_fit(RESULTS / "2026-11-25_zen4-2c_cluster" / "costmodel" / f"{rate}-fit-from-1mib" / "fit.csv")]
    with open(HERE / f"lenet-{rate}-none" / "scaling.csv", newline="") as f:
        for r in csv.DictReader(f):
            n, measured = int(r["world_size"]), float(r["step_ms"])
            compute = loop[(r["kind"], r["sync"], n, int(r["per_rank_batch"]))]
            comms = [allreduce_ms(fit, r["sync"], "lenet_fast", n) if n > 1 else 0.0 for fit in fits]
            steps = [f"{compute + c:.1f} ({(compute + c - measured) / measured:+.1%})" for c in comms]
            print(f"| {rate} | {n} | {measured:.1f} | {steps[0]} | {steps[1]} | {comms[0]:.1f} / {comms[1]:.1f} |")
