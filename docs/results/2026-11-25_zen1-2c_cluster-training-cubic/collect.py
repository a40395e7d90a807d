"""Every bench.scaling run of this record (lenet-<rate>-<compress>/, resnet18-<rate>-<compress>/)
as one table, table.md, from their scaling.csv."""
import csv
from pathlib import Path

HERE = Path(__file__).resolve().parent
HEADER = ["| model | link | sync.compress | hosts | images/s | efficiency | comm share | step ms | predicted ms | MFU |",
          "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]


def fmt(v, spec):
    return "-" if v in ("", None) else format(float(v), spec)


def rows(model: str, rate: str, compress: str) -> list[str]:
    path = HERE / f"{model}-{rate}-{compress}" / "scaling.csv"
    if not path.exists():
        return []
    digits = ".1f" if model == "lenet" else ".0f"
    with open(path, newline="") as f:
        return [f"| {model} | {rate} | {compress} | {r['world_size']} | {fmt(r['samples_per_sec'], ',.1f')} | "
                f"{fmt(r['efficiency'], '.0%')} | {fmt(r['comm_frac'], '.0%')} | {fmt(r['step_ms'], digits)} | "
                f"{fmt(r['predicted_step_ms'], digits)} | {fmt(r['mfu'], '.1%')} |" for r in csv.DictReader(f)]


lines = list(HEADER)
for model in ("lenet", "resnet18"):
    for rate in ("100mbit", "1gbit"):
        for compress in ("none", "bf16"):
            lines += rows(model, rate, compress)
(HERE / "table.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
