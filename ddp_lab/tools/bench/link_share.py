"""How close each allreduce came to its link: bus bandwidth over the link's rate,
and over what the algorithm's own formula allows on that link.

    python -m ddp_lab.tools.bench.link_share --rate 1gbit run-2h/ run-4h/ run-8h/
    python -m ddp_lab.tools.bench.link_share --rate 100mbit --from 4M --out FOLDER sweeps/*

Each input is a ddp_lab.tools.bench.collectives sweep (its collectives.csv or its
run directory) measured across emulated hosts (ddp_lab.tools.cluster) whose links
are shaped to --rate. An allreduce of N bytes on p ranks must move
2(p-1)/p N bytes through each rank's link at the least, so no allreduce has
a bus bandwidth (busbw, nccl-tests' measure) above the link's rate: the ring,
halving-doubling at a power of two and gloo's own can reach it. Other
algorithms move more, and their own formula (ddp_lab.tools.costmodel.formulas with
only the link's time per byte, no latency, no arithmetic) says how much of
the link they can reach at best: naive 1/p (the root's link carries every
rank's message both ways), halving-doubling on 3 ranks 1/2 (the folded-in
rank sends and receives the whole message). `of_allowed` is the measured
busbw over that best, the figure to hold each algorithm to.

Prints one row per algorithm, rank count and size from --from up, and the
smallest `of_allowed` of each (algorithm, ranks); writes link_share.csv,
link_share.md and record.json (ddp_lab.telemetry.provenance) to --out
(default outputs/bench/link_share/<time>/).
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from ddp_lab.config import ConfigError
from ddp_lab.telemetry.provenance import command_line, write_record
from ddp_lab.tools.bench import fresh_out_dir
from ddp_lab.tools.bench.collectives.interleaved import parse_size
from ddp_lab.tools.bench.collectives.sweep_plan import busbw_factor
from ddp_lab.tools.cluster.commands import ClusterError
from ddp_lab.tools.cluster.shaping import format_rate, parse_rate
from ddp_lab.tools.costmodel.formulas import MODELS

COLUMNS = ["algo", "world_size", "size_bytes", "busbw_gbps", "of_link", "allowed_of_link", "of_allowed"]


def allowed_share(algo: str, p: int, n: float) -> float:
    """The best busbw the algorithm's formula allows, as a share of the link's rate (1.0 for
    a bandwidth-optimal one): busbw_factor(p) N / time, with the time from the link alone."""
    if p < 2:
        return 1.0
    seconds_per_byte = 1.0  # any link: the share does not depend on its rate
    return busbw_factor(p) * n * seconds_per_byte / MODELS[algo](p, n, 0.0, seconds_per_byte, 0.0)


def rows_of(paths: list[Path], rate_bits: int, from_bytes: int) -> list[dict]:
    link_gbps = rate_bits / 8 / 1e9
    rows = []
    for path in paths:
        csv_path = path / "collectives.csv" if path.is_dir() else path
        with open(csv_path, newline="") as f:
            for r in csv.DictReader(f):
                p, n = int(r["world_size"]), int(r["size_bytes"])
                if n < from_bytes or r["algo"] not in MODELS:
                    continue
                busbw = float(r["busbw_gbps"])
                allowed = allowed_share(r["algo"], p, n)
                rows.append({"algo": r["algo"], "world_size": p, "size_bytes": n, "busbw_gbps": busbw,
                             "of_link": busbw / link_gbps, "allowed_of_link": allowed,
                             "of_allowed": busbw / link_gbps / allowed})
    return sorted(rows, key=lambda r: (r["algo"], r["world_size"], r["size_bytes"]))


def worst(rows: list[dict]) -> dict[tuple[str, int], float]:
    """The smallest of_allowed of every (algorithm, ranks)."""
    out: dict[tuple[str, int], float] = {}
    for r in rows:
        key = (r["algo"], r["world_size"])
        out[key] = min(out.get(key, float("inf")), r["of_allowed"])
    return out


def markdown(rows: list[dict], rate_bits: int, from_bytes: int) -> str:
    """One table: algorithms down, rank counts across; each cell the smallest busbw/allowed
    from `from_bytes` up, and (in brackets) the busbw over the link at the largest size."""
    worlds = sorted({r["world_size"] for r in rows})
    smallest = worst(rows)
    largest = {(r["algo"], r["world_size"]): r for r in rows}  # rows are sorted by size
    lines = [f"busbw over what each algorithm's formula allows on a {format_rate(rate_bits)} link, the "
             f"smallest from {from_bytes / 2 ** 20:g} MiB up (busbw over the link rate at the largest size)", "",
             "| algo | " + " | ".join(f"{w} ranks" for w in worlds) + " |", "|---" * (len(worlds) + 1) + "|"]
    for algo in sorted({r["algo"] for r in rows}):
        cells = []
        for w in worlds:
            key = (algo, w)
            cells.append(f"{smallest[key]:.0%} ({largest[key]['of_link']:.2f})" if key in largest else "-")
        lines.append(f"| {algo} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddp_lab.tools.bench.link_share", description=__doc__.split("\n")[0])
    p.add_argument("sweeps", nargs="+", type=Path, help="collectives.csv files or their run directories")
    p.add_argument("--rate", required=True, help="the links' rate, as given to ddp_lab.tools.cluster up: 1gbit, ...")
    p.add_argument("--from", dest="from_size", default="4M", help="smallest size counted (default 4M)")
    p.add_argument("--out", type=Path, default=None, help="a new folder for link_share.csv, link_share.md "
                   "and record.json (default outputs/bench/link_share/<time>)")
    a = p.parse_args(argv)
    try:
        rate = parse_rate(a.rate)
    except ClusterError as e:
        p.error(str(e))
    try:
        from_bytes = parse_size(a.from_size)
    except ConfigError:
        p.error(f"--from {a.from_size!r} is not a size in bytes; e.g. --from 4M or --from 1048576")
    missing = [s for s in a.sweeps if not (s / "collectives.csv" if s.is_dir() else s).is_file()]
    if missing:
        p.error(f"no collectives.csv at {missing[0]}: give sweeps of ddp_lab.tools.bench.collectives")
    rows = rows_of(a.sweeps, rate, from_bytes)
    if not rows:
        p.error(f"no measured size of {a.from_size} or more in the sweeps; lower --from")
    out = fresh_out_dir(a.out, "outputs/bench/link_share")
    for r in rows:
        print(f"{r['algo']:>18} {r['world_size']:>3} ranks {r['size_bytes']:>10} B  busbw {r['busbw_gbps']:.4f} GB/s"
              f"  {r['of_link']:.2f} of the link, formula allows {r['allowed_of_link']:.2f}: {r['of_allowed']:.0%}")
    table = markdown(rows, rate, from_bytes)
    print("\n" + table, end="")
    with open(out / "link_share.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    (out / "link_share.md").write_text(table)
    write_record(out, command_line("ddp_lab.tools.bench.link_share", sys.argv[1:] if argv is None else argv),
                 {"rate_bits": rate, "sweeps": [str(s) for s in a.sweeps]})
    print(f"# wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
