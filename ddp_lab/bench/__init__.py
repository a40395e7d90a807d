"""Benchmarks: collectives, training scaling, trainer against baselines, strategies raced to a target."""
from __future__ import annotations

import time
from pathlib import Path


def fresh_out_dir(out: Path | None, default_parent: str) -> Path:
    """The folder a benchmark writes into: --out, or <default_parent>/<start time>.

    An --out that already holds files is refused, so that a rerun never
    overwrites an earlier run's results (or trips over its run directories).
    """
    out = out or Path(default_parent) / time.strftime("%Y-%m-%d_%H-%M-%S")
    if out.is_dir() and any(out.iterdir()):
        raise SystemExit(f"--out {out} already holds an earlier run's files; choose another "
                         "--out (or leave it out: a new folder named by the time)")
    out.mkdir(parents=True, exist_ok=True)
    return out
