"""The tables of README.md: the collectives' busbw (median and range of the sweeps of bench/, as a
share of the 1 Gbit/s link) and the step times of step/runs.txt (median and range of 3, the ratio
to DDP's median, the cost model's price from price/ and its error)."""
import csv
import statistics
import sys
from pathlib import Path

here = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
LINK = 0.125  # GB/s each way
def busbw_table(folder: str, algos: tuple) -> None:
    busbw: dict = {}
    for f in sorted((here / folder).glob("*/collectives.csv")):
        hosts = f.parent.name.split("-")[1]
        for row in csv.DictReader(f.open()):
            assert row["wrong"] == "0", (f, row)
            key = (row.get("collective", "all_reduce"), hosts, int(row["size_bytes"]) >> 20, row["algo"])
            busbw.setdefault(key, []).append(float(row["busbw_gbps"]))
    print(f"| collective | hosts | MiB | {' | '.join(algos)} | direct / link | direct / builtin |")
    print("|---|---|---:|" + "---:|" * (len(algos) + 2))
    for coll, hosts, mib in sorted({k[:3] for k in busbw}, key=lambda k: (k[0] != "reduce_scatter", k)):
        cells, med = [], {}
        for algo in algos:
            v = busbw.get((coll, hosts, mib, algo), [])
            med[algo] = statistics.median(v) if v else float("nan")
            cells.append(f"{med[algo]:.4f} ({min(v):.4f}-{max(v):.4f})" if len(v) > 1 else f"{med[algo]:.4f}")
        print(f"| {coll} | {hosts} | {mib} | {' | '.join(cells)} | {med['direct'] / LINK:.0%} | "
              f"{med['direct'] / med['builtin']:.2f} |")
    print()


busbw_table("bench", ("builtin", "ring_textbook", "direct"))
busbw_table("bench-again", ("builtin", "direct"))

runs: dict = {}
by_repeat: dict = {}  # strategy -> repeat -> step ms
for line in (here / "step" / "runs.txt").read_text().splitlines():
    f = line.split()
    if "step_ms" in f:
        runs.setdefault(f[0], []).append((float(f[f.index("step_ms") + 1]), f[f.index("comm_ms_per_step") + 1]))
        by_repeat.setdefault(f[0], {})[f[1]] = float(f[f.index("step_ms") + 1])
predicted = {}
for algo, suffix in (("builtin", ""), ("direct", "-direct")):
    path = here / "price" / f"prediction-{algo}.txt"
    for line in (path.read_text().splitlines() if path.exists() else []):
        f = line.split()
        if f and f[0] in ("ddp", "zero1", "zero2", "zero3") and len(f) >= 7:
            predicted[f[0] + suffix] = float(f[6])
print("| sync | step ms, median (range) of 3 | / DDP's | / DDP's in the same repeat: median (range) "
      "| comm ms a step (median) | cost model's ms | error |")
print("|---|---|---:|---|---:|---:|---:|")
ddp = statistics.median(ms for ms, _ in runs["ddp"])
for s in ("ddp", "zero1", "zero1-direct", "zero2", "zero2-direct", "zero3", "zero3-direct"):
    ms = [m for m, _ in runs.get(s, [])]
    if not ms:
        continue
    comm = [float(c) for _, c in runs[s] if c != "None"]
    med, p = statistics.median(ms), predicted.get(s)
    ratios = [t / by_repeat["ddp"][k] for k, t in by_repeat[s].items()]
    print(f"| {s} | {med:,.1f} ({min(ms):,.1f}-{max(ms):,.1f}) | {med / ddp:.2f} | "
          f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | "
          f"{f'{statistics.median(comm):,.0f}' if comm else '-'} | {f'{p:,.1f}' if p else '-'} | "
          f"{f'{(p - med) / med:+.0%}' if p else '-'} |")
