"""The table of README.md from the four collectives.csv: each call's time across the hosts against
the link's time for its bytes (a rank sends (N-1)/N of the buffer; TCP's payload is at most 95.6% of
a 1 Gbit/s tbf link at MTU 1500) and against the same call's time on loopback.
    python summarize.py"""
import csv
from pathlib import Path

HERE = Path(__file__).parent
PAYLOAD = 1e9 / 8 * 0.956  # bytes a second


def times(folder):
    return {int(r["size_bytes"]): (float(r["time_us"]) / 1e3, float(r["busbw_gbps"]))
            for r in csv.DictReader(open(HERE / folder / "collectives.csv"))}


print("| hosts | MiB | across the hosts, ms | busbw / link | the link's time for the bytes, ms | "
      "beyond it, ms | the same call on loopback, ms |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for n in (2, 4):
    hosts, loop = times(f"hosts-{n}"), times(f"loopback-{n}")
    for size, (ms, busbw) in hosts.items():
        wire = (n - 1) / n * size / PAYLOAD * 1e3
        print(f"| {n} | {size >> 20} | {ms:.2f} | {busbw / 0.125:.0%} | {wire:.2f} | {ms - wire:.2f} "
              f"({(ms - wire) / wire:.0%}) | {loop[size][0]:.2f} |")
