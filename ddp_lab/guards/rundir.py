"""The run directory: is it usable, what does it already hold, and whose is it.

Every rank of a launch writes into one run directory (ddp_lab.config names
it). Nothing a user saved there may ever be written over, so before training:

* `check_usable` (run by Hydra, through `RunDirCheck`, before Hydra itself
  creates the directory or writes into it) turns a read-only mount, a path
  under a file, or a directory that cannot be created into one line.
* `earlier_results` lists what an earlier run left there (model.pt,
  summary.json, TensorBoard events, checkpoints).
* `launches.json` records every launch that wrote into the directory: the
  torchrun agents (host, boot, process id) and SLURM job behind it. A
  torchrun restart (the same agents) or a requeued SLURM job (the same job
  id) finds itself there and carries on with its own files; any other
  launch is a stranger, and may only continue the run from a checkpoint
  of the same config (ddp_lab.checkpoint.choice decides).
* `live_launch` finds a stranger still running: one job per run directory.
  Two jobs in one directory would write the same checkpoints over each
  other, so `RunDirCheck` refuses the second before it writes anything.
  It can see the processes of its own host only (a job on another host
  is not seen), and a launch is recorded once it has chosen what to resume
  from, a few seconds into its start.

Why not TORCHELASTIC_RESTART_COUNT alone: an attempt that was refused (it
found an earlier run) is restarted by torchrun too, and must be refused
again rather than take the restart count as leave to write; and a SLURM
requeue starts new agents whose count begins at 0.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from ddp_lab.config import ConfigError, error_file, say
from ddp_lab.telemetry.metrics import write_json_atomic
from ddp_lab.telemetry.position import process_state

LAUNCHES = "launches.json"


class RunDirTaken(ConfigError):
    """Refused: the run directory holds an earlier run this launch would write over."""
EVENTS_ONLY = "TensorBoard events in tb/"  # what a launch stopped before its first save leaves


# ---------------------------------------------------------------- usable at all
def _why_unusable(path: Path) -> str | None:
    """Why files cannot be written in `path` (creating it if needed), or None."""
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                return f"{parent} is a file, not a directory"
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        if e.errno == errno.EROFS:
            return "it is on a read-only filesystem"
        if e.errno in (errno.EACCES, errno.EPERM):
            return "permission denied"
        if e.errno == errno.ENOSPC:
            return "no space left on the device"
        return e.strerror or str(e)
    return None


def check_usable(path: Path, key: str = "hydra.run.dir") -> None:
    """ConfigError naming `path` and the fix if no run can write there."""
    why = _why_unusable(Path(path))
    if why is not None:
        raise ConfigError(f"run directory {path} is not usable: {why}. Choose another "
                          f"with {key}=<writable directory>")


class RunDirCheck(Callback):
    """Hydra callback (conf/train.yaml: hydra.callbacks): the run directory is
    checked before Hydra creates it and writes its .hydra/ record, which would
    otherwise fail with a raw traceback. Each rank checks for itself: a bad
    directory is bad for all of them, and no process group exists yet."""

    def on_run_start(self, config, **kwargs) -> None:
        self._check(OmegaConf.select(config, "hydra.run.dir"), "hydra.run.dir")

    def on_multirun_start(self, config, **kwargs) -> None:
        self._check(OmegaConf.select(config, "hydra.sweep.dir"), "hydra.sweep.dir")

    @staticmethod
    def _check(path, key: str) -> None:
        try:
            check_usable(Path(str(path)).absolute(), key)
            live = live_launch(Path(str(path)), launch_identity())
            if live is not None:
                raise ConfigError(f"run directory {path} is in use by a running job ({live}); "
                                  f"wait for it to end or stop it, or choose another with "
                                  f"{key}=<directory>")
        except ConfigError as e:
            say(f"ddp_lab: error: {e}")
            error_file.write(f"ddp_lab: error: {e}")  # torchrun's root cause
            sys.exit(2)


class LaunchTrace:
    """What Hydra wrote into the run directory for this launch before ddp_lab could
    look at it: rank 0's record under .hydra/launch-<time>/ and each rank's log lines.
    A launch refused for an earlier run there takes them back (`take_back`), so the
    directory is left as it was found."""

    def __init__(self, run_dir: Path, rank: int, hydra_subdir: str | None):
        self.log = Path(run_dir) / f"rank{rank}.log"
        self.log_size = self.log.stat().st_size if self.log.exists() else 0
        self.record = (Path(run_dir) / hydra_subdir if hydra_subdir and
                       hydra_subdir.startswith(".hydra/launch-") else None)

    def take_back(self) -> None:
        root = logging.getLogger()
        for h in list(root.handlers):  # close this rank's log before cutting it back
            if isinstance(h, logging.FileHandler) and Path(h.baseFilename) == self.log.absolute():
                h.close()
                root.removeHandler(h)
        try:
            if self.log_size == 0:
                self.log.unlink(missing_ok=True)  # Hydra made it for this launch
            else:
                os.truncate(self.log, self.log_size)
        except OSError:
            pass
        if self.record is not None:
            shutil.rmtree(self.record, ignore_errors=True)


# ---------------------------------------------------------------- what it holds
def earlier_results(run_dir: Path) -> list[str]:
    """What an earlier run left in `run_dir`, in words ([] when nothing)."""
    run_dir = Path(run_dir)
    held = [name for name in ("model.pt", "summary.json") if (run_dir / name).exists()]
    if _has_events(run_dir / "tb"):
        held.append(EVENTS_ONLY)
    ckpts = run_dir / "checkpoints"
    if ckpts.is_dir():
        steps = sorted(int(p.name[5:]) for p in ckpts.iterdir()
                       if p.name.startswith("step-") and p.name[5:].isdigit())
        if steps:
            held.append(f"checkpoints up to step-{steps[-1]}")
    return held


def _has_events(tb: Path) -> bool:
    return tb.is_dir() and any(p.name.startswith("events.") for p in tb.rglob("*"))


def set_events_aside(run_dir: Path) -> Path | None:
    """Move tb/ to tb-before-<time>/ when it holds events; returns where, or None."""
    tb = Path(run_dir) / "tb"
    if not _has_events(tb):
        return None
    aside = tb.with_name(f"tb-before-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while aside.exists():
        aside, n = tb.with_name(f"tb-before-{time.strftime('%Y%m%d-%H%M%S')}-{n}"), n + 1
    os.rename(tb, aside)
    return aside


# ---------------------------------------------------------------- whose it is
def _process_start(pid: int) -> str:
    """When process `pid` started (clock ticks since boot): a pid is reused, this pair is not."""
    return process_state(pid)[1]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return "?"


def launch_identity() -> list[str]:
    """Who this process belongs to: its torchrun agent (the parent process, the
    same for every restart of its workers), or itself without torchrun, and
    the SLURM job (the same when SLURM requeues it)."""
    host = socket.gethostname()
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    pid = os.getppid() if under_torchrun else os.getpid()
    ids = [f"{'agent' if under_torchrun else 'process'}:{host}/{_boot_id()}/{pid}/{_process_start(pid)}"]
    if os.environ.get("SLURM_JOB_ID"):
        ids.append(f"slurm:{os.environ['SLURM_JOB_ID']}")
    return ids


def read_launches(run_dir: Path) -> list[dict]:
    try:
        return json.loads((Path(run_dir) / LAUNCHES).read_text())["launches"]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def owned_by(run_dir: Path, identities: list[str]) -> bool:
    """Whether a launch with any of these identities already wrote into `run_dir`."""
    mine = set(identities)
    return any(mine & set(launch.get("owners", [])) for launch in read_launches(run_dir))


def _running(identity: str) -> str | None:
    """`identity` (launch_identity's form) in words if it is a process running on this
    host now, else None."""
    kind, _, where = identity.partition(":")
    parts = where.split("/")
    if kind not in ("agent", "process") or len(parts) != 4 or not parts[2].isdigit():
        return None
    host, boot, pid, start = parts
    if host != socket.gethostname() or boot != _boot_id() or _process_start(int(pid)) != start:
        return None
    return f"{'torchrun agent' if kind == 'agent' else 'process'} {pid} on {host}"


def live_launch(run_dir: Path, identities: list[str]) -> str | None:
    """Another launch that wrote into `run_dir` and still runs here, in words, or None."""
    mine = set(identities)
    for launch in read_launches(run_dir):
        owners = set(launch.get("owners", []))
        if owners & mine:
            continue
        for owner in sorted(owners):
            running = _running(owner)
            if running is not None:
                return f"{running}, started {launch.get('started_at', '?')}"
    return None


def record_launch(run_dir: Path, identities: list[str], resumed_from: str | None) -> None:
    """Add this launch to launches.json (rank 0), or its new agents to its entry."""
    run_dir = Path(run_dir)
    launches = read_launches(run_dir)
    mine = set(identities)
    for launch in launches:
        if mine & set(launch.get("owners", [])):
            launch["owners"] = sorted(mine | set(launch["owners"]))
            break
    else:
        launches.append({"started_at": time.strftime("%Y-%m-%d %H:%M:%S"),
                         "owners": sorted(mine), "resumed_from": resumed_from})
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / LAUNCHES, {"launches": launches})
