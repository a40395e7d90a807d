"""The race's tables: one row per run (strategy and seed), and per strategy the median and range
over the seeds (bench.time_to_accuracy writes both).

Each run is compared with DDP's run of the same seed (`vs_ddp`): the same initial weights and
data order, so the ratio is the strategy's effect rather than the seed's. Time to target is
reported with its evaluations and without them (`train_to_target_s`: evaluations take the same
time whatever the network, and the races evaluate at different intervals than a user would).
"""
from __future__ import annotations

import re
import statistics

COLUMNS = ["strategy", "seed", "sync", "world_size", "target", "target_reached", "steps_to_target",
           "time_to_target_s", "eval_s_to_target", "train_to_target_s", "vs_ddp", "wire_bytes_per_step",
           "wire_bytes_to_target", "bytes_vs_ddp", "collectives_per_step", "collectives_to_target",
           "wire_bytes_across_per_step", "wire_bytes_across_to_target", "collectives_across_to_target",
           "final", "step_ms", "eval_s", "steps", "every",
           "predicted_time_to_target_s", "prediction_error", "diverged_at_step"]


def row(strategy: str, seed, s: dict, every: int, headline: str) -> dict:
    """One run's row from its summary.json."""
    t, e = s["time_to_target_s"], s.get("eval_s_to_target")
    return {"strategy": strategy, "seed": seed, "sync": s["sync"], "world_size": s["world_size"],
            "target": next(iter(s["target"].values())), "target_reached": s["target_reached"],
            "steps_to_target": s["steps_to_target"], "time_to_target_s": t, "eval_s_to_target": e,
            "train_to_target_s": t - e if t is not None and e is not None else None,
            "wire_bytes_per_step": s["wire_bytes_per_step"], "wire_bytes_to_target": s.get("wire_bytes_to_target"),
            "collectives_per_step": s.get("collectives_per_step"),  # (None: a run from before they were counted)
            "collectives_to_target": s.get("collectives_to_target"),
            # sync.islands: the bytes that crossed between islands (the rest stayed inside)
            "wire_bytes_across_per_step": s.get("wire_bytes_across_per_step"),
            "wire_bytes_across_to_target": s.get("wire_bytes_across_to_target"),
            "collectives_across_to_target": s.get("collectives_across_to_target"),
            "final": s[headline], "step_ms": s["step_ms"], "eval_s": s["eval_s"], "steps": s["steps"],
            "every": every}


def diverged(strategy: str, seed, world: int, target: float, message: str) -> dict:
    """The row of a run the divergence guard stopped: a result of the race (a target missed), not a failure."""
    m = re.search(r"training diverged: .* at step (\d+)", message)
    return {**dict.fromkeys(COLUMNS), "strategy": strategy, "seed": seed, "world_size": world, "target": target,
            "target_reached": False, "diverged_at_step": int(m.group(1)) if m else None}


def compare(rows: list[dict]) -> None:
    """Each row's time and bytes against DDP's run of the same seed (where DDP ran and reached it)."""
    ddp = {r["seed"]: r for r in rows if r["strategy"] == "ddp"}
    for r in rows:
        d = ddp.get(r["seed"])
        if d and d["time_to_target_s"] and r["time_to_target_s"]:
            r["vs_ddp"] = r["time_to_target_s"] / d["time_to_target_s"]
        if d and d["wire_bytes_per_step"] and r["wire_bytes_per_step"]:
            r["bytes_vs_ddp"] = d["wire_bytes_per_step"] / r["wire_bytes_per_step"]


def fmt(v, spec: str = "") -> str:
    if v is None or v == "":
        return "-"
    return format(v, spec) if spec else str(v)


def markdown(rows: list[dict]) -> str:
    """Every run, one row each."""
    lines = ["| strategy | seed | sync | steps to target | s to target | of which evaluating | x DDP's time | "
             "predicted s | bytes/step | bytes to target | DDP's bytes / these | collectives/step | final | step ms |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        final = f"diverged at step {r['diverged_at_step']}" if r.get("diverged_at_step") else fmt(r['final'], '.4f')
        lines.append(f"| {r['strategy']} | {fmt(r['seed'])} | {fmt(r['sync'])} | {fmt(r['steps_to_target'])} | "
                     f"{fmt(r['time_to_target_s'], '.1f')} | {fmt(r['eval_s_to_target'], '.1f')} | "
                     f"{fmt(r.get('vs_ddp'), '.2f')} | {fmt(r.get('predicted_time_to_target_s'), '.1f')} | "
                     f"{fmt(r['wire_bytes_per_step'], ',.0f')} | {fmt(r['wire_bytes_to_target'], ',.0f')} | "
                     f"{fmt(r.get('bytes_vs_ddp'), '.1f')} | {fmt(r.get('collectives_per_step'), '.2f')} | "
                     f"{final} | {fmt(r['step_ms'], '.1f')} |")
    return "\n".join(lines) + "\n"


def spread(values: list) -> tuple[float, float, float] | None:
    """(median, lowest, highest) of the values that exist; None if none does."""
    v = [float(x) for x in values if x is not None and x != ""]
    return (statistics.median(v), min(v), max(v)) if v else None


MEDIANS = ("steps_to_target", "time_to_target_s", "train_to_target_s", "vs_ddp", "wire_bytes_to_target",
           "wire_bytes_across_to_target",
           "final", "step_ms", "predicted_time_to_target_s", "prediction_error")


def by_strategy(rows: list[dict]) -> list[dict]:
    """Per strategy (in the order raced): the seeds run and reached, and each figure's spread."""
    out = {}
    for r in rows:
        out.setdefault(r["strategy"], []).append(r)
    return [{"strategy": name, "sync": next((r["sync"] for r in runs if r["sync"]), None), "runs": len(runs),
             "reached": sum(bool(r["target_reached"]) for r in runs),
             "diverged": sum(bool(r.get("diverged_at_step")) for r in runs),
             **{k: spread([r.get(k) for r in runs]) for k in MEDIANS}} for name, runs in out.items()]


def _cell(s, spec: str, scale: float = 1.0) -> str:
    if s is None:
        return "-"
    m, lo, hi = (x * scale for x in s)
    return f"{m:{spec}} ({lo:{spec}}-{hi:{spec}})" if lo != hi else f"{m:{spec}}"


def summary_markdown(groups: list[dict]) -> str:
    """The median (lowest-highest) over the seeds of each strategy."""
    lines = ["| strategy | sync | seeds reached | steps to target | s to target | s without evaluations | "
             "x DDP's time | MB to target | of which across islands | predicted s | prediction error | final | "
             "step ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for g in groups:
        reached = f"{g['reached']}/{g['runs']}" + (f" ({g['diverged']} diverged)" if g.get("diverged") else "")
        lines.append(f"| {g['strategy']} | {fmt(g['sync'])} | {reached} | "
                     f"{_cell(g['steps_to_target'], '.0f')} | {_cell(g['time_to_target_s'], '.1f')} | "
                     f"{_cell(g['train_to_target_s'], '.1f')} | {_cell(g['vs_ddp'], '.2f')} | "
                     f"{_cell(g['wire_bytes_to_target'], '.1f', 1e-6)} | "
                     f"{_cell(g['wire_bytes_across_to_target'], '.1f', 1e-6)} | "
                     f"{_cell(g['predicted_time_to_target_s'], '.1f')} | {_cell(g['prediction_error'], '+.0%')} | "
                     f"{_cell(g['final'], '.4f')} | {_cell(g['step_ms'], '.0f')} |")
    return "\n".join(lines) + "\n"
