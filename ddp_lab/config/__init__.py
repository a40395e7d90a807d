"""Hydra glue shared by every ddp_lab entry point.

Why a resolver for the run directory: Hydra's default `outputs/${now:...}` is
evaluated by each rank on its own, seconds apart, so the ranks of one launch
would write into different directories. torchrun gives every worker of a
launch (and of its restarts, and of every node) the same TORCHELASTIC_RUN_ID,
so the run directory is named after it. `--standalone` makes that id a random
UUID and ignores `--rdzv_id`: name such a run with DDP_LAB_RUN_ID=NAME, or
pin the directory with `hydra.run.dir=...`. A launch without torchrun uses the start time instead.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

# Configs ship inside the package (conf/ is mapped to ddp_lab.conf), so the
# entry points work from an editable checkout and from a plain `pip install .`.
CONFIG_PATH = "pkg://ddp_lab.conf"

_START_TIME = time.strftime("%Y-%m-%d_%H-%M-%S")


class ConfigError(ValueError):
    """A bad input from the user: printed as one clear line, exit status 2."""


class RunFailed(RuntimeError):
    """The run cannot go on (it diverged, the disk is full, a peer is gone):
    printed as one clear line, exit status 1, every rank alike."""


def say(line: str) -> None:
    """Write `line` and its newline to stderr in one write.

    Why not print(): the ranks of a launch share torchrun's stderr, and print()
    writes the text and the newline apart (stderr is unbuffered), so two ranks
    failing together ran their lines into one. One write of a short line to a
    pipe is atomic.
    """
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def run_id() -> str:
    """The name of this launch's run directory, identical on every rank."""
    explicit = os.environ.get("DDP_LAB_RUN_ID")
    if explicit:
        return explicit
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic.lower() != "none":
        return elastic
    return _START_TIME


def hydra_subdir_for_rank() -> str | None:
    """Where Hydra records this launch's config: `.hydra/`, written by rank 0 only.

    A later launch into the same run directory (a resume, or one that is about
    to be refused) must not replace the first launch's record, so it writes
    into `.hydra/launch-<start time>/` instead.
    """
    if os.environ.get("RANK", "0") != "0":
        return None
    from hydra.core.hydra_config import HydraConfig  # set by Hydra before it resolves this
    try:
        out = Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # not inside a Hydra job (compose API): nothing is written anyway
        return ".hydra"
    if (out / ".hydra" / "config.yaml").exists():
        return f".hydra/launch-{_START_TIME}"
    return ".hydra"


OmegaConf.register_new_resolver("ddp_lab.run_id", run_id, replace=True)
OmegaConf.register_new_resolver("ddp_lab.hydra_subdir", hydra_subdir_for_rank, replace=True)
