"""The trainer's one contact with checkpoints: save, resume at start.

When a checkpoint is due is the run's schedule's answer (training/schedule.py):
every `trainer.ckpt_every_steps` optimizer steps, where the run ends mid-epoch
(so the epoch can be finished later), and at every epoch's end.
`trainer.keep_ckpts=0` writes none.
"""
from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import NamedTuple

from ddp_lab.checkpoint.choice import choose
from ddp_lab.checkpoint.compat import config_hash, config_subset, mode_of, validate
from ddp_lab.checkpoint.files import DIRNAME, STATE, agree, all_finite, load, problem, rank_file, read_meta, save
from ddp_lab.checkpoint.reshard import load_own
from ddp_lab.checkpoint.whole_state import CheckpointOptimizerState, CheckpointWeights
from ddp_lab.config import ConfigError, RunFailed
from ddp_lab.distributed import DistEnv
from ddp_lab.guards.rundir import record_launch

log = logging.getLogger("ddp_lab")


class Resumed(NamedTuple):
    path: Path
    shared: dict  # rank 0's state: model, optimizer, schedule, scaler, position
    own: dict  # this rank's: RNG states, the partial epoch's sums
    world_size: int  # of the run that wrote it (see reshard.py for another one now)
    written_under: str = ""  # the sync mode that wrote it, where this run's is another (whole_state.py)

    def describe(self, step: int, position: str, world_size: int) -> str:
        line = f"resumed from {self.path} (step {step}, {position})"
        if world_size != self.world_size:
            line += f" on {world_size} ranks, written by {self.world_size}"
        if self.written_under:
            line += (f"; written under {self.written_under}: its weights and optimizer state read by "
                     f"parameter name, a tensor at a time, and cut for this sync mode")
        return line


class Checkpointer:
    def __init__(self, cfg, env: DistEnv, run_dir: Path):
        t = cfg.trainer
        self.keep, self.resume_setting = t.keep_ckpts, t.resume
        self.env, self.run_dir = env, Path(run_dir)
        self.root = self.run_dir / DIRNAME
        self.subset = config_subset(cfg)  # what must match to resume (see compat)
        self.seed = cfg.seed
        self.choice = None  # what resume() chose

    def save(self, step: int, shared: dict | None, own: dict) -> Path | None:
        """Every rank calls this at the same step; `shared` is rank 0's (None elsewhere)."""
        if self.keep == 0:
            return None
        meta = None
        if "weights" in own:  # each rank's own shards: every rank learns whether one is not finite
            agree(self.env, None if all_finite(own["weights"]) else f"refusing to write checkpoint step-{step}: "
                  "the model holds non-finite weights", f"checkpoint step-{step}: weights checked")
        if self.env.is_main:
            if not all_finite(shared["model"]):  # the loss check should have stopped us first
                raise RunFailed(f"refusing to write checkpoint step-{step}: the model holds "
                                "non-finite weights")
            meta = {"epoch": shared["epoch"], "batches_done": shared["batches_done"],
                    "config_hash": config_hash(self.subset), "config": self.subset}
        return save(self.root, step, self.env, own, shared, meta, self.keep)

    def resume(self) -> Resumed | None:
        """Load what this launch continues from (see choice), or None: from scratch. Each rank checks the
        checksums of the files it reads whole, all at once; one found damaged: the checkpoint before it."""
        env, skip = self.env, set()
        while True:
            self.choice = choose(self.resume_setting, self.run_dir, env, skip)
            path = self.choice.path
            if path is None:
                return None
            damaged = [d for d in agree(env, None, "checkpoint checked", self._damaged(path)) if d]
            if not damaged:
                break
            if self.resume_setting not in ("auto", "none") and not self.choice.owned:  # (trainer.resume=<path>)
                raise ConfigError(f"trainer.resume={self.resume_setting}: not a usable checkpoint: {damaged[0]}")
            if env.is_main:
                log.warning("skipping checkpoint %s: %s; trying the one before it", path, damaged[0])
            skip.add(path)
        meta = read_meta(path)
        across = validate(path, meta, self.subset)  # (only the sync mode differs: its state read by name)
        own = partial(load_own, rank=env.rank, world_size=env.world_size,
                      saved_world_size=meta["world_size"], seed=self.seed, step=meta["step"])
        shared, mine = load(path, env.rank, env.device, own, mapped=across)  # (across: read a tensor at a time)
        if not across:
            return Resumed(path, shared, mine, meta["world_size"])
        shared = {**shared, "whole": (CheckpointWeights(path), CheckpointOptimizerState(path, shared))}
        return Resumed(path, shared, mine, meta["world_size"], mode_of(meta["config"]["sync"]))

    def _damaged(self, path: Path) -> str | None:
        """Why a file this rank reads whole does not match its checksum (its own; rank 0 also state.pt), or None.
        (At another world size the old ranks' files are mapped and only the rows taken are read: sizes checked.)"""
        meta, r = read_meta(path), self.env.rank
        mine = [rank_file(r)] if meta["world_size"] == self.env.world_size else []
        why = problem(path, verify=[*mine, *([STATE] if self.env.is_main else [])])
        return f"rank {r}: {why}" if why else None

    def record_launch(self) -> None:
        """Note in launches.json that this launch writes here (rank 0; after resume())."""
        if self.env.is_main:
            path, owned = self.choice.path, self.choice.owned
            record_launch(self.run_dir, self.choice.owners, None if owned or path is None else str(path))
