"""busbw.csv and table.md of the jumbo-frames record: busbw over the link's rate,
median and range of the rounds, beside TCP's payload ceiling at each MTU.

    python docs/results/2026-11-26_zen4-2c_cluster-jumbo-frames/collect.py FOLDER
"""
import csv
import re
import statistics
import sys
from pathlib import Path

from ddp_lab.cluster.shaping import tcp_payload_share

LINK_GBPS = 0.125  # 1 Gbit/s
NAME = re.compile(r"(\d+)h-mtu(\d+)-(\d+)\Z")


def main(folder: Path) -> None:
    rows = []
    for sweep in sorted((folder / "sweeps").iterdir()):
        m = NAME.match(sweep.name)
        if not m or not (sweep / "collectives.csv").is_file():
            continue
        hosts, mtu, round_ = map(int, m.groups())
        with open(sweep / "collectives.csv", newline="") as f:
            for r in csv.DictReader(f):
                rows.append({"hosts": hosts, "mtu": mtu, "round": round_, "algo": r["algo"],
                             "size_bytes": int(r["size_bytes"]),
                             "busbw_of_link": round(float(r["busbw_gbps"]) / LINK_GBPS, 4)})
    with open(folder / "busbw.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cells: dict[tuple, list[float]] = {}
    for r in rows:
        cells.setdefault((r["hosts"], r["algo"], r["size_bytes"], r["mtu"]), []).append(r["busbw_of_link"])
    mtus = sorted({r["mtu"] for r in rows})
    lines = ["busbw over the link's rate (1 Gbit/s): median of the rounds [lowest, highest]", "",
             "| hosts | algo | size | " + " | ".join(f"MTU {m}" for m in mtus) + " |",
             "|---|---|---|" + "---|" * len(mtus),
             "| | TCP payload at most | | " + " | ".join(f"{tcp_payload_share(m):.1%}" for m in mtus) + " |"]
    for hosts, algo, size in sorted({k[:3] for k in cells}, key=lambda k: (-k[0], k[1], k[2])):
        vals = [cells.get((hosts, algo, size, m), []) for m in mtus]
        lines.append(f"| {hosts} | {algo} | {size >> 20} MiB | " + " | ".join(
            f"{statistics.median(v):.1%} [{min(v):.1%}, {max(v):.1%}]" if v else "-" for v in vals) + " |")
    (folder / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
