"""busbw.csv and table.md of the jumbo-frames record: busbw over the link's rate,
median and range of the rounds, beside TCP's payload ceiling at each MTU.

    python docs/results/2026-11-26_zen4-2c_cluster-jumbo-frames/collect.py FOLDER
    python .../collect.py FOLDER sweeps-100mbit 0.0125   # busbw-100mbit.csv, table-100mbit.md
"""
import csv
import re
import statistics
import sys
from pathlib import Path

from ddp_lab.cluster.shaping import tcp_payload_share

NAME = re.compile(r"(\d+)h-mtu(\d+)-(\d+)\Z")


def main(folder: Path, sweeps: str = "sweeps", link_gbps: float = 0.125) -> None:
    """link_gbps: the links' rate in GB/s (0.125: 1 Gbit/s)."""
    suffix = sweeps.removeprefix("sweeps")
    rows = []
    for sweep in sorted((folder / sweeps).iterdir()):
        m = NAME.match(sweep.name)
        if not m or not (sweep / "collectives.csv").is_file():
            continue
        hosts, mtu, round_ = map(int, m.groups())
        with open(sweep / "collectives.csv", newline="") as f:
            for r in csv.DictReader(f):
                rows.append({"hosts": hosts, "mtu": mtu, "round": round_, "algo": r["algo"],
                             "size_bytes": int(r["size_bytes"]),
                             "busbw_of_link": round(float(r["busbw_gbps"]) / link_gbps, 4)})
    with open(folder / f"busbw{suffix}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cells: dict[tuple, list[float]] = {}
    for r in rows:
        cells.setdefault((r["hosts"], r["algo"], r["size_bytes"], r["mtu"]), []).append(r["busbw_of_link"])
    mtus = sorted({r["mtu"] for r in rows})
    lines = [f"busbw over the link's rate ({link_gbps * 8:g} Gbit/s): median of the rounds [lowest, highest]", "",
             "| hosts | algo | size | " + " | ".join(f"MTU {m}" for m in mtus) + " |",
             "|---|---|---|" + "---|" * len(mtus),
             "| | TCP payload at most | | " + " | ".join(f"{tcp_payload_share(m):.1%}" for m in mtus) + " |"]
    for hosts, algo, size in sorted({k[:3] for k in cells}, key=lambda k: (-k[0], k[1], k[2])):
        vals = [cells.get((hosts, algo, size, m), []) for m in mtus]
        lines.append(f"| {hosts} | {algo} | {size >> 20} MiB | " + " | ".join(
            f"{statistics.median(v):.1%} [{min(v):.1%}, {max(v):.1%}]" if v else "-" for v in vals) + " |")
    (folder / f"table{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3], *map(float, sys.argv[3:4]))
