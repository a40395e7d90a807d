"""vs_baseline's table: one row per system from the runs' results, the notes under it
(each trainer row's ratio to the baseline, or the scaling efficiency, with the ratio
within each round), and its markdown and CSV renderings. Pure: no runs, no torch."""
from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Callable
from pathlib import Path

from ddp_lab.tools.bench.vs_baseline.runs import parse_worlds

COLUMNS = ["system", "runs", "global_batch", "images_per_sec_median", "images_per_sec_min",
           "images_per_sec_max", "mfu", "sec_per_epoch", "test_acc", "peak_mem_mb_per_process",
           "ratio"]
HEADERS = ["system", "runs", "global batch", "images/s (median)", "min", "max", "MFU", "sec/epoch",
           "test acc", "peak mem/process (MiB)", "ratio"]


def summarize(results: list[dict], reference: str | None = None) -> list[dict]:
    """One row per system, in order of first appearance; `ratio` is relative to `reference`.

    Each result holds at least system, samples_per_sec, sec_per_epoch, test_acc
    and peak_mem_mb (None where not measured), and global_batch and mfu where known
    (a NaN mfu counts as unknown). reference defaults to the first system.
    """
    systems: dict[str, list[dict]] = {}
    for r in results:
        systems.setdefault(r["system"], []).append(r)
    if not systems:
        return []
    reference = reference or next(iter(systems))
    if reference not in systems:
        raise ValueError(f"reference system {reference!r} has no results; have {', '.join(systems)}")

    def median(runs, key):
        vals = [r[key] for r in runs if r.get(key) is not None and r[key] == r[key]]  # not NaN
        return statistics.median(vals) if vals else None

    ref_rate = median(systems[reference], "samples_per_sec")
    rows = []
    for name, runs in systems.items():
        rates = [r["samples_per_sec"] for r in runs]
        mems = [r["peak_mem_mb"] for r in runs if r.get("peak_mem_mb") is not None]
        rate = statistics.median(rates)
        batches = sorted({r["global_batch"] for r in runs if r.get("global_batch") is not None})
        rows.append({
            "system": name, "runs": len(runs),
            "global_batch": "/".join(str(b) for b in batches) or None,
            "images_per_sec_median": rate, "images_per_sec_min": min(rates),
            "images_per_sec_max": max(rates), "mfu": median(runs, "mfu"),
            "sec_per_epoch": median(runs, "sec_per_epoch"),
            "test_acc": median(runs, "test_acc"),
            "peak_mem_mb_per_process": max(mems) if mems else None,
            "ratio": rate / ref_rate if ref_rate else None,
        })
    return rows


def scaling_efficiency(results: list[dict], small: str, large: str,
                       small_world: int, large_world: int) -> float:
    """rate(large) / (large_world / small_world * rate(small)), medians over repeats."""
    rate = {name: statistics.median([r["samples_per_sec"] for r in results if r["system"] == name])
            for name in (small, large)}
    return rate[large] / (large_world / small_world * rate[small])


def paired_ratios(results: list[dict], system: str, reference: str) -> list[float]:
    """rate(system) / rate(reference) within each round (runs of the same repeat), in
    round order. The runs of a round follow each other, so each ratio compares two runs
    that saw nearly the same machine; rounds missing either system are left out."""
    ref = {r["repeat"]: r["samples_per_sec"] for r in results if r["system"] == reference}
    mine = sorted((r["repeat"], r["samples_per_sec"]) for r in results
                  if r["system"] == system and r.get("repeat") in ref)
    return [rate / ref[repeat] for repeat, rate in mine]


def _per_round(values: list[float], show: Callable[[float], str]) -> str:
    """' Per round: a, b, c; median m.' for two or more rounds, else ''."""
    if len(values) < 2:
        return ""
    return f" Per round: {', '.join(map(show, values))}; median {show(statistics.median(values))}."


def _fmt(key: str, v) -> str:
    if v is None:
        return "-"
    if key.startswith("images_per_sec"):
        return f"{v:,.0f}"
    if key == "sec_per_epoch":
        return f"{v:.1f}"
    if key == "test_acc":
        return f"{v:.4f}"
    if key == "peak_mem_mb_per_process":
        return f"{v:,.0f}"
    if key == "ratio":
        return f"{v:.2f}x"
    if key == "mfu":
        return f"{v:.1%}"
    return str(v)


def markdown_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(HEADERS) - 1)) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(k, row[k]) for k in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def csv_text(rows: list[dict]) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: ("" if row[k] is None else row[k]) for k in COLUMNS})
    return out.getvalue()


def report_text(rows: list[dict], notes: list[str]) -> str:
    return markdown_table(rows) + "".join(f"\n{n}" for n in notes) + ("\n" if notes else "")



def notes_for(rows: list[dict], results: list[dict], a) -> list[str]:
    if not rows:
        return []
    if a.compare_world:
        worlds = parse_worlds(a.compare_world)
        small = f"trainer {worlds[0]}p"
        out = []
        for w in worlds[1:]:
            large = f"trainer {w}p"
            eff = scaling_efficiency(results, small, large, worlds[0], w)
            rounds = [x / (w / worlds[0]) for x in paired_ratios(results, large, small)]
            out.append(f"Scaling efficiency: rate({w}p) / ({w / worlds[0]:g} x rate({worlds[0]}p)) = {eff:.1%} "
                       f"({a.per_process_batch} images and {a.threads or 'default'} thread(s) per process)."
                       + _per_round(rounds, lambda v: f"{v:.1%}"))
        return out
    base, out = rows[0], []
    for trainer in rows[1:]:
        acc = ""
        if base["test_acc"] is not None and trainer["test_acc"] is not None:
            acc = f", test accuracy {trainer['test_acc'] - base['test_acc']:+.4f}"
        if base["mfu"] is not None and trainer["mfu"] is not None:
            acc += f", MFU {trainer['mfu']:.1%} against {base['mfu']:.1%}"
        name = "Trainer" if len(rows) == 2 else trainer["system"]
        batches = f"global batch {trainer['global_batch'] or '?'} against {base['global_batch'] or '?'}"
        rounds = paired_ratios(results, trainer["system"], base["system"])
        out.append(f"{name} / baseline: {trainer['ratio']:.2f}x images/s{acc} "
                   f"(medians of {trainer['runs']} run(s), {a.epochs} epoch(s), {batches})."
                   + _per_round(rounds, lambda v: f"{v:.2f}x"))
    return out


def write_outputs(out: Path, rows: list[dict], notes: list[str]) -> str:
    text = report_text(rows, notes)
    (out / "table.md").write_text(text)
    (out / "table.csv").write_text(csv_text(rows))
    return text

