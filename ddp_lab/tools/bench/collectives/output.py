"""A collectives sweep's rows: collectives.csv, the printed table in nccl-tests'
layout, and the median of repeated sweeps."""
from __future__ import annotations

import csv
import statistics
from pathlib import Path

from ddp_lab.tools.bench.collectives.sweep_plan import algbw_gbps, busbw_gbps

CSV_COLUMNS = ["algo", "size_bytes", "count", "dtype", "world_size",
               "time_us", "algbw_gbps", "busbw_gbps", "wrong"]
# nccl-tests' short type names, for the printed table.
_TYPE_LABEL = {"float32": "float", "float64": "double", "bfloat16": "bfloat16", "float16": "half"}


def csv_columns(collective: str = "all_reduce") -> list[str]:
    """collectives.csv's columns: an all-reduce's as ever; reduce_scatter's and
    all_gather's end with `collective`, since their busbw has another factor."""
    return CSV_COLUMNS if collective == "all_reduce" else [*CSV_COLUMNS, "collective"]


def median_of_runs(paths: list[str | Path]) -> list[dict]:
    """Combine repeated sweeps: per (collective, algo, dtype, world_size, size) the median time_us.

    On a shared machine one sweep can catch a burst of someone else's load;
    the median over a few sweeps, taken minutes apart, does not. algbw/busbw are
    recomputed from the median time; wrong is the largest count of any run.

        from ddp_lab.tools.bench.collectives.output import median_of_runs, write_rows
        write_rows(median_of_runs(["run1/collectives.csv", "run2/collectives.csv",
                                   "run3/collectives.csv"]), "collectives_median.csv")
    """
    groups: dict[tuple, list[dict]] = {}
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                key = (r.get("collective") or "all_reduce", r["algo"], r["dtype"], int(r["world_size"]),
                       int(r["size_bytes"]))
                groups.setdefault(key, []).append(r)
    out = []
    for (collective, algo, dtype, world, size), rs in groups.items():
        t = statistics.median(float(r["time_us"]) for r in rs)
        alg = algbw_gbps(size, t)
        out.append({"algo": algo, "size_bytes": size, "count": int(rs[0]["count"]), "dtype": dtype,
                    "world_size": world, "time_us": sig(t), "algbw_gbps": sig(alg),
                    "busbw_gbps": sig(busbw_gbps(alg, world, collective)),
                    "wrong": max(int(r["wrong"]) for r in rs), "collective": collective})
    return out


def write_rows(rows: list[dict], path: str | Path) -> Path:
    """Write rows in collectives.csv's format (with `collective` where a row is not an all-reduce)."""
    kinds = {r.get("collective") or "all_reduce" for r in rows}
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=csv_columns("all_reduce" if kinds <= {"all_reduce"} else "other"),
                           extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return Path(path)


def sig(x: float, digits: int = 6) -> float:
    """Round to significant digits: tiny bandwidths keep their precision in the CSV."""
    return float(f"{x:.{digits}g}")


def header(plan) -> str:
    return ("#\n"
            f"# {'size':>12} {'count':>12} {'type':>8} {'algo':>16} {'time':>11} "
            f"{'algbw':>8} {'busbw':>8} {'#wrong':>7} {'iters':>6}\n"
            f"# {'(B)':>12} {'(elements)':>12} {'':>8} {'':>16} {'(us)':>11} "
            f"{'(GB/s)':>8} {'(GB/s)':>8} {'':>7} {'':>6}")


def line(r: dict) -> str:
    return (f"  {r['size_bytes']:>12} {r['count']:>12} {_TYPE_LABEL[r['dtype']]:>8} {r['algo']:>16} "
            f"{r['time_us']:>11.1f} {r['algbw_gbps']:>8.3f} {r['busbw_gbps']:>8.3f} "
            f"{r['wrong'] if r['wrong'] >= 0 else 'N/A':>7} {r['iters']:>6}")
