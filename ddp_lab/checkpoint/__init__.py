"""Checkpoints: written so that a kill, a full disk or a damaged file never costs a good one.

Open in this order:

* checkpointer.py: the Checkpointer the trainer uses (save when due, resume).
* choice.py: which checkpoint a launch continues from, and when a run
  directory that holds an earlier run is left alone.
* files.py: the layout on disk, the safe write, integrity checks, pruning.
* compat.py: whether a checkpoint fits this run (config hash, world size).
* rng.py: every RNG state, stored per rank.
"""
from ddp_lab.checkpoint.checkpointer import Checkpointer, Resumed
from ddp_lab.checkpoint.choice import Choice, choose, pick
from ddp_lab.checkpoint.compat import (
    HASHED_GROUPS,
    NOT_HASHED,
    TRAINER_HASHED,
    config_diff,
    config_hash,
    config_subset,
    validate,
)
from ddp_lab.checkpoint.files import (
    DIRNAME,
    META,
    STATE,
    load,
    newest,
    problem,
    prune,
    rank_file,
    read_meta,
    save,
    step_dirs,
)
from ddp_lab.checkpoint.rng import rng_state, set_rng_state

__all__ = [
    "DIRNAME", "HASHED_GROUPS", "META", "NOT_HASHED", "STATE", "TRAINER_HASHED", "Checkpointer",
    "Choice", "Resumed", "choose", "config_diff", "config_hash", "config_subset", "load",
    "newest", "pick", "problem", "prune", "rank_file", "read_meta", "rng_state", "save",
    "set_rng_state", "step_dirs", "validate",
]
