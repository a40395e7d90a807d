"""The host points of this record priced again with the all-sizes fits in costmodel-<rate>-all-sizes/
(fitted on the Zen 4 cluster record's 2-3 host sweeps from 64 KiB, not from 1 MiB as the fit that
bench.scaling used): LeNet's gradient, 258 KB in bf16, is below 1 MiB.

    python docs/results/2026-11-26_zen4-2c_cluster-lenet-predictions/repriced.py > repriced.md
"""
import csv
from pathlib import Path

from ddp_lab.costmodel.step_time import allreduce_ms, load_fit, loopback_steps

HERE = Path(__file__).resolve().parent
loop = loopback_steps(HERE / "lenet-loopback-bf16" / "scaling.csv")
print("| link | hosts | measured ms | from-1-MiB fit ms | all-sizes fit ms | all-reduce: from 1 MiB / all sizes |")
print("|---|---:|---:|---:|---:|---:|")
for rate in ("1gbit", "100mbit"):
    fit = load_fit(HERE / f"costmodel-{rate}-all-sizes" / "fit.csv")
    with open(HERE / f"lenet-{rate}-bf16" / "scaling.csv", newline="") as f:
        for r in csv.DictReader(f):
            n, measured = int(r["world_size"]), float(r["step_ms"])
            compute = loop[(r["kind"], r["sync"], n, int(r["per_rank_batch"]))]
            comm = allreduce_ms(fit, r["sync"] + "+bf16", "lenet_fast", n) if n > 1 else 0.0
            old = float(r["predicted_step_ms"])
            new = compute + comm
            print(f"| {rate} | {n} | {measured:.1f} | {old:.1f} ({(old - measured) / measured:+.1%}) | "
                  f"{new:.1f} ({(new - measured) / measured:+.1%}) | {old - compute:.1f} / {comm:.1f} |")
