"""The cost model's step time beside each point of a scaling study (bench.scaling --fit).

predicted step = compute + the all-reduce of the model's gradients, priced by
ddp_lab.tools.costmodel.step_time. The compute of N ranks is, by default, the
1-rank step scaled by the per-rank batch and by max(1, ranks x threads /
cores) where ranks share the cores. That under-counts emulated hosts that
share 2 cores: lock-step ranks taking turns on the cores also wait for each
other (3 LeNet hosts at 1 Gbit/s: a step predicted a fifth short). With
--compute-from, the compute of N hosts is the measured step of the same
study on loopback at N ranks: the same sharing, the all-reduce at memory
speed (docs/costmodel.md, "Against a network"). It carries the loopback
runs' noise.
"""
from __future__ import annotations

import os

from ddp_lab.config import ConfigError


def predicted(p, points: list, fit, threads: int, loopback=None) -> float | None:
    """The cost model's step time for a point: its compute (the loopback study's step
    of as many ranks, or the 1-rank step's scaled: see the docstring) plus the all-reduce."""
    if fit is None:
        return None
    from ddp_lab.tools.costmodel.fitting import contention
    from ddp_lab.tools.costmodel.step_time import predicted_step_ms

    if loopback is not None:
        compute = loopback.get((p.kind, p.sync, p.world_size, p.per_rank_batch))
    else:
        one = next((o for o in points if (o.kind, o.sync, o.world_size) == (p.kind, p.sync, 1)), None)
        if one is None or one.step_ms is None:
            return None
        compute = one.step_ms * p.per_rank_batch / one.per_rank_batch
        compute *= contention(p.world_size * threads, os.cpu_count())
    return None if compute is None else predicted_step_ms(fit, p.described_sync, p.model, p.world_size, compute)


def loopback_compute(args) -> dict[tuple[str, str, int, int], float]:
    """The loopback study's steps (--compute-from) for every point of the planned study;
    ValueError naming what is missing or wrong."""
    from ddp_lab.tools.costmodel.step_time import loopback_steps  # torch: see scaling.py

    if args.fit is None:
        raise ValueError("--compute-from needs --fit: it is the compute of the predicted step")
    try:
        loopback = loopback_steps(args.compute_from)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    missing = missing_loopback_points(args, loopback)
    if missing:
        raise ValueError(f"--compute-from {args.compute_from} has no step for {', '.join(missing)}: "
                         "run the same study with --worlds on loopback first")
    return loopback


def missing_loopback_points(args, loopback: dict) -> list[str]:
    """The points of the planned study that the loopback study did not measure."""
    missing = []
    for kind in args.kinds:
        for sync in args.syncs:
            for world in args.worlds:
                batch = args.per_rank_batch if kind == "weak" else args.global_batch // world
                if (kind, sync, world, batch) not in loopback:
                    missing.append(f"{kind} {sync} {world} rank(s) x {batch}")
    return missing
