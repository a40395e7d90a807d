"""The cost model's time to validation loss 2.8 across 4 hosts at 10 Mbit/s to 10 Gbit/s, from the
loopback race and the 100mbit link's fit (no race on emulated hosts ran to the end: see README.md)."""
from ddp_lab.cluster.shaping import parse_rate
from ddp_lab.costmodel.step_time import load_fit
from ddp_lab.costmodel.strategies import by_rate, loopback_rows

FIT = "docs/results/2026-11-26_zen4-2c_cluster-lenet-predictions/costmodel-100mbit-all-sizes/fit.csv"
RATES = ["10mbit", "100mbit", "1gbit", "10gbit"]
rows = loopback_rows("docs/results/2026-11-26_zen1-2c_race-gpt/loopback-4/race.csv")
seconds = by_rate(rows, load_fit(FIT)["builtin"], parse_rate("100mbit"), 4, [parse_rate(r) for r in RATES])
print("| strategy | " + " | ".join(RATES) + " |\n|---|" + "---:|" * len(RATES))
for name, values in seconds.items():
    print(f"| {name} | " + " | ".join(f"{v:.0f} ({v / d:.2f})" for v, d in zip(values, seconds["ddp"])) + " |")
