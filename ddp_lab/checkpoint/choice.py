"""Which checkpoint a run continues from, and when a run dir must be left alone.

The rules, decided once by rank 0 for all ranks:

* A launch that already wrote into this run directory (launches.json names
  its torchrun agents or its SLURM job: a torchrun restart, a requeued job)
  continues from its newest intact checkpoint; if it died before its first
  checkpoint it starts again as it was told.
* Starting again where an earlier launch left TensorBoard events but no
  checkpoint and no result (stopped before its first save), the events are
  moved aside to tb-before-<time>/, so the curves start clean; nothing else
  was there to lose.
* Any other launch may write there only to continue: `trainer.resume=auto`
  continues from the newest intact checkpoint (its config is checked by
  compat.validate). With nothing to continue from, a run directory that
  holds an earlier result (model.pt, summary.json, checkpoints) is refused
  in one line saying what is there and where to go instead; an empty one
  starts afresh (a new SLURM job, say).
* `trainer.resume=<path>` loads that checkpoint into a run directory that
  holds nothing yet.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import torch.distributed as dist

from ddp_lab.checkpoint.files import DIRNAME, META, STEP_DIR, newest, problem
from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv
from ddp_lab.guards.rundir import (
    EVENTS_ONLY,
    RunDirTaken,
    earlier_results,
    launch_identity,
    owned_by,
    set_events_aside,
)

log = logging.getLogger("ddp_lab")


class Choice(NamedTuple):
    path: Path | None  # the checkpoint to continue from; None: start from scratch
    owned: bool  # this launch had already written into the run directory
    owners: list[str]  # the identities of every rank's launch (see ddp_lab.guards.rundir)


def _explicit(path: Path) -> Path:
    """trainer.resume=<path>: a step-N dir, or a checkpoints/ dir or run dir (its newest)."""
    if not path.exists():
        raise ConfigError(f"trainer.resume={path}: no such file or directory")
    if (path / META).exists() or STEP_DIR.match(path.name):
        why = problem(path)
        if why:
            raise ConfigError(f"trainer.resume={path}: not a usable checkpoint: {why}")
        return path
    for root in (path, path / DIRNAME):
        found = newest(root)
        if found is not None:
            return found
    raise ConfigError(f"trainer.resume={path}: no complete checkpoint there "
                      f"(expected a step-N directory, or a folder holding them)")


def _refuse_if_taken(run_dir: Path, resume: str) -> None:
    """ConfigError if `run_dir` holds an earlier run that this launch would write over."""
    held = earlier_results(run_dir)
    if not held or (resume == "auto" and held == [EVENTS_ONLY]):
        return
    what = f"{run_dir} already holds an earlier run ({', '.join(held)})"
    where = "in another directory (hydra.run.dir=... or DDP_LAB_RUN_ID=<name>)"
    if resume == "auto":
        raise RunDirTaken(f"trainer.resume=auto: {what} but no intact checkpoint to continue "
                          f"from, and will not overwrite it; start afresh {where}")
    if resume == "none":
        fix = ("Continue it with trainer.resume=auto, or start afresh"
               if newest(run_dir / DIRNAME) else "Start afresh")
        raise RunDirTaken(f"{what}, which a new run there would overwrite. {fix} {where}")
    raise RunDirTaken(f"{what}, which this run would overwrite: resume from {resume} {where}")


def pick(resume: str, run_dir: Path, owned: bool, skip=()) -> Path | None:
    """The checkpoint to continue from (None: from scratch), by the rules above; `skip`: checkpoints a rank
    found damaged. Its files' sizes are checked here, their checksums by the ranks that read them."""
    run_dir = Path(run_dir)
    if owned or resume == "auto":
        found = newest(run_dir / DIRNAME, verify=(), skip=skip)
        if found is not None:
            return found
    if not owned:
        _refuse_if_taken(run_dir, resume)
    if resume in ("none", "auto"):
        moved = set_events_aside(run_dir)
        if moved is not None:
            log.warning("%s holds an earlier launch's TensorBoard events but no checkpoint or "
                        "result (it stopped before its first save): starting afresh, those "
                        "events moved to %s", run_dir, moved.name)
        return None
    return _explicit(Path(resume).expanduser())


def choose(resume: str, run_dir: Path, env: DistEnv, skip=()) -> Choice:
    """pick() on rank 0, the answer (or its ConfigError) sent to every rank.

    One rank decides so that all ranks load the same step even if their views
    of the filesystem differ; every rank's launch identity counts, since after
    an elastic restart rank 0 may live on another host than before.
    """
    owners = launch_identity()
    if env.distributed:
        gathered = [None] * env.world_size
        dist.all_gather_object(gathered, owners)
        owners = sorted({i for ids in gathered for i in ids})
    answer = [None, None, False, False]  # [path, error, owned, whether the error is RunDirTaken]
    if env.is_main:
        try:
            owned = owned_by(run_dir, owners)
            found = pick(resume, run_dir, owned, skip)
            answer = [None if found is None else str(found), None, owned, False]
        except ConfigError as e:
            answer[1], answer[3] = str(e), isinstance(e, RunDirTaken)
    if env.distributed:
        dist.broadcast_object_list(answer, src=0, device=env.device)
    if answer[1] is not None:
        raise (RunDirTaken if answer[3] else ConfigError)(answer[1])
    return Choice(None if answer[0] is None else Path(answer[0]), answer[2], owners)
