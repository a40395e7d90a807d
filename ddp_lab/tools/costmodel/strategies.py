"""Pricing the strategies past the bandwidth wall: time to a target on a link one does not have.

    time to target on a link = the loopback run's time to target
                             + the link's time for the all-reduces it made up to the target

The loopback run (the same ranks on one machine's loopback, ddp_lab.tools.bench.
time_to_accuracy --ranks N) measures once what the network does not change:
how many steps the strategy needs (the same seed and data take the same
steps on any link), its compute per step (PowerSGD's compression and
decompression included), its evaluations, all with all-reduces at memory
speed. The link adds, per step, the all-reduce of the bytes the strategy
sends: DDP and PowerSGD every step, local SGD and DiLoCo their weights once
every H = sync.every steps, priced by the alpha-beta-gamma model of the
builtin all-reduce (ddp_lab.tools.costmodel.formulas, the ring formula) with the
link's fitted constants. The bytes are those the loopback run counted up to
its target (`wire_bytes_to_target`: PowerSGD's plain steps come first, so
its average over a whole run under-prices them), spread over its
synchronisations; a race.csv from before that count falls back to the
run's bytes per step. Each collective that carried them pays the link's
latency (`collectives_to_target`: DDP one a bucket, PowerSGD three a bucket,
DiLoCo in 4 bits two a sync); a race.csv from before they were counted
charges one a synchronisation. DiLoCo with sync.overlap=TAU computes TAU inner steps
while its outer all-reduce travels: only what the all-reduce takes beyond
TAU loopback steps is added. DiLoCo in F fragments (sync.fragments) makes F
synchronisations a round, each of 1/F of the bytes, each hidden or paid alone.
Given a fit of loopback itself (`local`), the loopback run's own collectives
are priced on it and taken out first: what is left is compute (DDP's loopback
all-reduce partly overlapped its backward, so this takes out a little too
much there; an overlapped DiLoCo's is hidden and left in).

Islands (sync.islands, "N islands of K" in the sync description: IslandSync's periodic strategy across, or
HSDP's gradient shards every step) talk inside over the same loopback the loopback run had, so only what
crossed between islands is added (`wire_bytes_across_to_target`): each island's K ranks send their chunks
over the host's one link at once, priced as one all-reduce of K chunks among the N islands, on `across` (a
fit of the link at one rank a host) where given, each collective across at its latency
(`collectives_across_to_target`: HSDP one a unit a step; a race.csv from before they were counted charges
DiLoCo one a synchronisation, two in 4 bits).

At another rate the link's seconds per byte scale as 1/rate: `by_rate` prices
each strategy across rates, so a user reads at which bandwidth each starts
to pay against DDP.
"""
from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path

from ddp_lab.config import ConfigError
from ddp_lab.tools.costmodel.formulas import MODELS, Params
from ddp_lab.tools.costmodel.step_time import load_fit


def time_to_target_s(loopback: dict, link: Params, world: int, local: Params | None = None,
                     across: Params | None = None) -> float | None:
    """A loopback race's row (race.csv) priced on `link` (and net of its collectives on `local`, a fit
    of loopback; islands' outer gradients on `across`); None where it missed the target."""
    if not loopback.get("time_to_target_s"):
        return None
    steps, every = int(loopback["steps_to_target"]), int(loopback["every"])
    sent = float(loopback.get("wire_bytes_to_target") or steps * float(loopback["wire_bytes_per_step"]))
    syncs = steps / every * fragments_of(loopback)
    calls = float(loopback.get("collectives_to_target") or syncs)
    islands = islands_of(loopback)
    if islands:  # only the outer gradients cross, K chunks at once over each island's link
        count, size = islands
        sent = float(loopback["wire_bytes_across_to_target"]) * size
        calls = float(loopback.get("collectives_across_to_target") or
                      (2 * syncs if "+int" in (loopback.get("sync") or "") else syncs))
        world, link, local = count, across or link, None  # (the inside stays on loopback, as measured)

    def per_sync(on: Params) -> float:  # the bytes at its bandwidth, every collective at its latency
        latency = on.time(MODELS["builtin"], world, 0)
        return on.time(MODELS["builtin"], world, sent / syncs) + (calls / syncs - 1) * latency
    overlap = overlap_of(loopback)
    hidden = overlap * float(loopback.get("step_ms") or 0) / 1e3  # computed while it travels
    compute = float(loopback["time_to_target_s"]) - (syncs * per_sync(local) if local and not overlap else 0.0)
    return compute + syncs * max(0.0, per_sync(link) - hidden)


def overlap_of(row: dict) -> int:
    """DiLoCo's sync.overlap (TAU) of a race's row, read from its sync description; 0 if none."""
    m = re.search(r"overlap (\d+)", row.get("sync") or "")
    return int(m.group(1)) if m else 0


def islands_of(row: dict) -> tuple[int, int] | None:
    """(islands, ranks each) of a race's row under sync.islands (IslandSync's "islands(N islands of K: ...",
    fsdp's "(HSDP: N islands of K)"), from its sync description; None if none."""
    m = re.search(r"(?:islands\(|HSDP: )(\d+) islands of (\d+)", row.get("sync") or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def fragments_of(row: dict) -> int:
    """DiLoCo's sync.fragments of a race's row, read from its sync description; 1 if none."""
    m = re.search(r"fragments (\d+)", row.get("sync") or "")
    return int(m.group(1)) if m else 1


def loopback_rows(path: Path) -> dict[tuple[str, str], dict]:
    """A loopback race's rows by (strategy, seed) (seed "" where the race gave none)."""
    try:
        with open(path, newline="") as f:
            return {(r["strategy"], r.get("seed") or ""): r for r in csv.DictReader(f)}
    except (OSError, KeyError) as e:
        raise ConfigError(f"{path}: not a race.csv of ddp_lab.tools.bench.time_to_accuracy ({e}); run it with "
                          "--ranks N on loopback first and give its race.csv") from None


def predict_rows(rows: list[dict], fit_path: Path, steps_from: Path, local_fit: Path | None = None,
                 across_fit: Path | None = None) -> None:
    """Add the predicted time to target (and its error) to each measured row of a race, from the
    loopback run of the same strategy and seed (net of its collectives, priced by local_fit; islands'
    outer gradients priced by across_fit)."""
    link, loopback = load_fit(fit_path)["builtin"], loopback_rows(steps_from)
    local = load_fit(local_fit)["builtin"] if local_fit else None
    across = load_fit(across_fit)["builtin"] if across_fit else None
    for r in rows:
        seed = "" if r.get("seed") is None else str(r["seed"])
        base = loopback.get((r["strategy"], seed))
        if base is None or int(base["world_size"]) != r["world_size"]:
            raise ConfigError(f"--steps-from {steps_from} has no {r['strategy']} run of {r['world_size']} ranks"
                              f"{' and seed ' + seed if seed else ''}: race the same strategies and seeds at the "
                              "same world size on loopback first")
        r["predicted_time_to_target_s"] = time_to_target_s(base, link, r["world_size"], local, across)
        if r["predicted_time_to_target_s"] and r["time_to_target_s"]:
            r["prediction_error"] = r["predicted_time_to_target_s"] / r["time_to_target_s"] - 1


def by_rate(loopback: dict[str, list[dict]], link: Params, link_bits: int, world: int,
            rates_bits: list[int], local: Params | None = None,
            across: Params | None = None) -> dict[str, list[float | None]]:
    """Predicted seconds to target of each strategy at each rate (the link's constants, and the link
    across islands', with their seconds per byte scaled by link_bits / rate): the median over the
    strategy's loopback runs (one per seed) that reached the target."""
    def scale(p: Params | None, bits: int) -> Params | None:
        return None if p is None else Params(p.alpha, p.beta * link_bits / bits, p.gamma)
    out = {}
    for name, runs in loopback.items():
        out[name] = []
        for bits in rates_bits:
            times = [t for t in (time_to_target_s(r, scale(link, bits), world, local, scale(across, bits))
                                 for r in runs) if t is not None]
            out[name].append(statistics.median(times) if times else None)
    return out
