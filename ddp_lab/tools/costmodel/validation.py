"""Does the cost model predict what it was not fitted to? Held-out sweeps, and beta against the link.

    python -m ddp_lab.tools.costmodel 'inputs=[h2/collectives.csv,h3/collectives.csv]' \\
        'validate=[h4/collectives.csv,h8/collectives.csv]' link_rate=1gbit

The fit sees only `inputs` (e.g. 2 and 3 ranks); every point of the `validate`
sweeps (e.g. 4 and 8 ranks) is then predicted from the fitted constants and
set beside its measured time: rel_error = (predicted - measured) / measured.
A fit that only follows its own points, rather than the algorithm's cost,
shows here. validation.csv in the run directory holds every point.

link_rate: the rate the network was built to (an emulated cluster's --rate);
1/beta, the per-link bandwidth the fit found, is printed beside it. TCP over
1500-byte Ethernet frames carries at most 1448 payload bytes per 1514 on the
wire (95.6%; 99.3% with link_mtu=9000, ddp_lab.tools.cluster.shaping), so 1/beta
near 96% of the rate means the links run full.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from ddp_lab.tools.cluster.shaping import DEFAULT_MTU, tcp_payload_share
from ddp_lab.tools.costmodel.fitting import Fit, Point, read_points
from ddp_lab.tools.costmodel.formulas import MODELS
from ddp_lab.tools.costmodel.report import write_csv

COLUMNS = ["algo", "world_size", "size_bytes", "predicted_us", "measured_us", "rel_error"]
LARGE_BYTES = 1 << 20  # the errors are summarised for all sizes and from 1 MiB up


def held_out_rows(fits: dict[str, Fit], points: list[Point]) -> list[dict]:
    """One row per held-out point whose algorithm was fitted, predicted as the fit models its own."""
    rows = []
    for pt in sorted(points, key=lambda p: (p.algo, p.world_size, p.size_bytes)):
        f = fits.get(pt.algo)
        if f is None:
            continue
        predicted = f.model_time(MODELS[pt.algo], pt)
        rows.append({"algo": pt.algo, "world_size": pt.world_size, "size_bytes": pt.size_bytes,
                     "predicted_us": round(predicted * 1e6, 3), "measured_us": round(pt.time_s * 1e6, 3),
                     "rel_error": round((predicted - pt.time_s) / pt.time_s, 4)})
    return rows


def summary(rows: list[dict]) -> dict[str, dict]:
    """Per algorithm: median and max |rel_error| over all sizes and from LARGE_BYTES up."""
    out: dict[str, dict] = {}
    for algo in dict.fromkeys(r["algo"] for r in rows):
        errs = [abs(r["rel_error"]) for r in rows if r["algo"] == algo]
        large = [abs(r["rel_error"]) for r in rows if r["algo"] == algo and r["size_bytes"] >= LARGE_BYTES]
        out[algo] = {"points": len(errs), "median": statistics.median(errs), "max": max(errs),
                     "median_large": statistics.median(large) if large else None,
                     "max_large": max(large) if large else None,
                     "worlds": sorted({r["world_size"] for r in rows if r["algo"] == algo})}
    return out


def validate_held_out(fits: dict[str, Fit], paths: list[Path], run_dir: Path, log=print) -> list[dict]:
    """Predict every point of the held-out sweeps, print the comparison, write validation.csv."""
    points = read_points(paths, log)
    rows = held_out_rows(fits, points)
    unfitted = sorted({pt.algo for pt in points} - set(fits))
    log("")
    log(f"HELD OUT: {len(rows)} points of world sizes {sorted({r['world_size'] for r in rows})} "
        f"from {len(paths)} file(s), predicted by the fit to world sizes "
        f"{sorted({pt.world_size for f in fits.values() for pt in f.points})}")
    if unfitted:
        log(f"# not fitted, so not predicted: {', '.join(unfitted)}")
    log(f"  {'algo':<17} {'ranks':>5} {'size (B)':>11} {'predicted us':>13} {'measured us':>12} {'error':>7}")
    for r in rows:
        log(f"  {r['algo']:<17} {r['world_size']:>5} {r['size_bytes']:>11} {r['predicted_us']:>13.1f} "
            f"{r['measured_us']:>12.1f} {r['rel_error']:>+7.1%}")
    log(f"  {'algo':<17} {'points':>6} {'median|err|':>11} {'max|err|':>9}   from 1 MiB: median, max")
    for algo, s in summary(rows).items():
        large = ("-" if s["median_large"] is None
                 else f"{s['median_large']:.1%}, {s['max_large']:.1%}")
        log(f"  {algo:<17} {s['points']:>6} {s['median']:>11.1%} {s['max']:>9.1%}   {large}")
    if rows:
        write_csv(run_dir / "validation.csv", rows)
        log(f"# wrote {run_dir / 'validation.csv'}")
    return rows


def print_beta_against_link(fits: dict[str, Fit], link_bits: int, mtu: int = DEFAULT_MTU, log=print) -> None:
    link = link_bits / 8
    log(f"# link_rate {link_bits / 1e6:g} Mbit/s = {link / 1e6:.2f} MB/s per link and direction "
        f"(TCP payload at most {link * tcp_payload_share(mtu) / 1e6:.2f} MB/s at MTU {mtu})")
    for algo, f in fits.items():
        if f.params.beta > 0:
            bw = 1 / f.params.beta
            log(f"  {algo:<17} 1/beta {bw / 1e6:8.2f} MB/s = {bw / link:6.1%} of the link rate")
        else:
            log(f"  {algo:<17} beta 0: the fit puts all time in alpha and gamma")
