"""Every bench.scaling run of a training record (lenet-<rate>-<compress>/, resnet18-<rate>-<compress>/)
as one table, table.md, and a plot, bandwidth_matters.png, from their scaling.csv; each folder's
runs.csv keeps every run's figures from its summary.json (the run folders are not kept).

    python collect.py [RECORD]   # default: this record's folder
"""
import csv
import json
import sys
from pathlib import Path

HERE = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parent
RUN_COLUMNS = ["run", "world_size", "global_batch", "steps", "measured_steps", "samples_per_sec", "step_ms",
               "comm_ms_per_step", "comm_frac", "mfu", "test_acc", "model", "sync"]
RATES = ("100mbit", "1gbit", "loopback")  # loopback: the same ranks under torchrun --standalone
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


def write_runs_csv(folder: Path) -> None:
    summaries = sorted(folder.glob("runs/*/summary.json"))
    if not summaries:
        return  # written before, and the run folders removed
    with open(folder / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RUN_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for path in summaries:
            w.writerow({"run": path.parent.name, **json.loads(path.read_text())})


for folder in sorted(p for p in HERE.iterdir() if (p / "scaling.csv").exists()):
    write_runs_csv(folder)
lines = list(HEADER)
for model in ("lenet", "resnet18"):
    for rate in RATES:
        for compress in ("none", "bf16"):
            lines += rows(model, rate, compress)
(HERE / "table.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))


def plot() -> None:
    """bandwidth_matters.png: scaling efficiency and predicted against measured step, by hosts."""
    if not any(r["efficiency"] for path in HERE.glob("*/scaling.csv") for r in csv.DictReader(open(path))):
        print("no 1-rank points, so no efficiency: bandwidth_matters.png not drawn")
        return
    from ddp_lab.bench.plots import pyplot
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = {"100mbit": "-", "1gbit": "--", "loopback": ":"}
    for model, marker in (("lenet", "o"), ("resnet18", "s")):
        for rate in RATES:
            for compress in ("none", "bf16"):
                path = HERE / f"{model}-{rate}-{compress}" / "scaling.csv"
                if not path.exists():
                    continue
                with open(path, newline="") as f:
                    rs = list(csv.DictReader(f))
                label = f"{model} {rate} {compress}"
                scaled = [r for r in rs if r["efficiency"]]  # blank without a 1-rank point
                axes[0].plot([int(r["world_size"]) for r in scaled], [100 * float(r["efficiency"]) for r in scaled],
                             styles[rate], marker=marker, label=label)
                if rate != "loopback":  # no network to price
                    axes[1].plot([float(r["predicted_step_ms"]) for r in rs],
                                 [float(r["step_ms"]) for r in rs], marker, label=label)
    axes[0].set(xlabel="hosts (one rank each)", ylabel="scaling efficiency (%)", xticks=[1, 2, 3, 4],
                title="weak scaling across emulated hosts (2 shared cores)")
    axes[0].legend(fontsize=7)
    low = min(axes[1].get_xlim()[0], axes[1].get_ylim()[0])
    top = max(axes[1].get_xlim()[1], axes[1].get_ylim()[1])
    axes[1].plot([low, top], [low, top], "k:", label="measured = predicted")
    axes[1].set(xscale="log", yscale="log", xlabel="cost model's step (ms)", ylabel="measured step (ms)",
                title="step time: measured against predicted")
    fig.tight_layout()
    fig.savefig(HERE / "bandwidth_matters.png", dpi=120)


plot()
