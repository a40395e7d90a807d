"""Benchmarks, each `python -m ddp_lab.tools.bench.<name>` (or under torchrun):

    collectives/       allreduce algorithms timed and checked, as nccl-tests does (Hydra)
    scaling.py         training throughput over world sizes, on loopback or emulated hosts
    vs_baseline/       the trainer against the chapter's own programs
    time_to_accuracy.py  sync strategies raced to a target accuracy or loss
    link_share.py      a sweep's bus bandwidth over its link's rate
    fault_drill.py     each injected fault's time to the last rank's exit
    run_plot.py        a picture of one training run

Each writes a new folder with a record.json (docs/configuration.md: the rule for outputs).
"""
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
