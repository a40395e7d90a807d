"""Checkpoints on disk: write one safely, find the newest intact one, prune, load.

Layout, inside the run directory (shared by every rank and node):

    checkpoints/step-<N>/state.pt      rank 0: model, optimizer, LR schedule, grad scaler,
                                        epoch, batches done in the epoch, step, ...
    checkpoints/step-<N>/rank<R>.pt    every rank its own: RNG states and the partial
                                        epoch's running sums (they differ per rank); under
                                        zero and fsdp its shard of the optimizer state, and
                                        where the weights are sharded (stage 3, fsdp) its
                                        shards of them (state.pt then holds none)
    checkpoints/step-<N>/meta.json     rank 0, written last: world size, config and its
                                        hash, size and SHA-256 of every file above (each
                                        rank hashes its own file as it writes it)

Why it survives a kill at any moment: a checkpoint is written into
`.tmp-step-<N>/`, every file is fsynced, and only then is the directory
renamed to `step-<N>/` (one atomic rename) and its parent fsynced. A kill
before the rename leaves a temp dir that nobody reads; a kill after it leaves
a complete checkpoint. meta.json's checksums catch what the rename cannot
(a file damaged later, a copy cut short): such a checkpoint is skipped with a
warning in favour of the one before it. A resume checks every file's size, and
each rank the checksum of what it reads whole (its own file; rank 0 also
state.pt), all ranks at once (checkpointer.py): no rank reads what others own.

Why it survives a full disk: after each phase every rank tells the others
whether its writes worked (`agree`), so one rank's failure (rank 0's
state.pt is the largest file) stops all of them at the same place with the
same one-line message, the temporary directory is removed, and the
published checkpoints are left as they were.

Everything is read back with `torch.load(weights_only=True)`, so RNG states
are stored as tensors and plain lists, never as pickled Python objects.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_lab.config import ConfigError, RunFailed
from ddp_lab.distributed import DistEnv
from ddp_lab.telemetry import position

log = logging.getLogger("ddp_lab")

DIRNAME = "checkpoints"
STATE = "state.pt"
META = "meta.json"
FORMAT = 1
STEP_DIR = re.compile(r"^step-(\d+)$")


def rank_file(rank: int) -> str:
    return f"rank{rank}.pt"


# ---------------------------------------------------------------- writing
def _fsync_dir(path: Path) -> None:
    """Make a rename or a new file in `path` durable (the entry lives in the directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some network filesystems refuse fsync on a directory; the rename still happened
    finally:
        os.close(fd)


class _Hashing:
    """A file that hashes what is written through it (torch.save writes in order: write and flush only)."""

    def __init__(self, f):
        self.f, self.sha, self.bytes = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.bytes += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()

    def __getattr__(self, name):  # (tell, truncate: the file's own)
        return getattr(self.f, name)


def _write_durable(path: Path, write) -> dict:
    """Write `path` by write(file), fsynced; its {"bytes", "sha256"}, hashed as it was written."""
    with open(path, "wb") as f:
        hashing = _Hashing(f)
        write(hashing)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": hashing.bytes, "sha256": hashing.sha.hexdigest()}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def nbytes(state) -> int:
    """About how many bytes torch.save writes for `state` (its tensors' data)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(nbytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(nbytes(v) for v in state)
    return 0


def all_finite(state: dict) -> bool:
    """Whether every floating-point tensor in a state dict is finite."""
    return all(torch.isfinite(t).all() for t in state.values()
               if isinstance(t, torch.Tensor) and t.is_floating_point())


def write_error(what: str, folder: Path, needed: int, e: BaseException) -> str:
    """One line for a failed write: a full disk said as such, anything else as it is."""
    try:
        free = shutil.disk_usage(folder if folder.exists() else folder.parent).free
    except OSError:
        free = None
    full = (isinstance(e, OSError) and e.errno == 28) or "No space left" in str(e) or (
        free is not None and free < needed)
    if full:
        return (f"no space left on {folder} while writing {what} (it needs about "
                f"{needed / 2**20:.1f} MB); free some space or point hydra.run.dir elsewhere")
    return f"could not write {what} in {folder}: {type(e).__name__}: {e}"


def agree(env: DistEnv, error: str | None, name: str, said=None) -> list:
    """A barrier that carries failures: every rank raises the first rank's error, if any; else every
    rank's `said`, by rank. `name`: the collective's, as the stall lines say it (each agreement its own)."""
    answers = [(error, said)]
    if env.distributed:
        answers = [None] * env.world_size
        with position.collective(name):
            dist.all_gather_object(answers, (error, said))
    failed = [(r, e) for r, (e, _) in enumerate(answers) if e is not None]
    if failed:
        rank, message = failed[0]
        raise RunFailed(message if rank == env.rank else f"rank {rank}: {message}")
    return [s for _, s in answers]


def save(root: Path, step: int, env: DistEnv, own: dict, shared: dict | None,
         meta: dict | None, keep: int) -> Path:
    """Write checkpoint `step` from every rank; returns its final directory.

    Every rank calls this at the same step (the loop runs in lockstep), so the
    agreements below always meet. `own` is this rank's state; `shared` and
    `meta` are rank 0's (None elsewhere).
    """
    root = Path(root)
    tmp, final = root / f".tmp-step-{step}", root / f"step-{step}"
    what = f"checkpoint step-{step}"
    error = None
    position.phase(f"{what}: making its folder")
    if env.is_main:
        try:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was killed
            tmp.mkdir()
        except OSError as e:
            error = write_error(what, root, nbytes(shared), e)
    agree(env, error, f"{what}: folder made")  # before any rank writes into it
    position.phase(f"{what}: writing rank{env.rank}.pt" + (" and state.pt" if env.is_main else ""))
    written = {}  # file -> its size and checksum, hashed as written (by each rank, at once)
    try:
        if not tmp.is_dir():
            error = (f"rank {env.rank} cannot see {tmp}, which rank 0 just created: the run "
                     "directory must be on a filesystem that every node shares")
        else:
            written[rank_file(env.rank)] = _write_durable(tmp / rank_file(env.rank), lambda f: torch.save(own, f))
            if env.is_main:
                written[STATE] = _write_durable(tmp / STATE, lambda f: torch.save(shared, f))
    except (OSError, RuntimeError) as e:  # torch.save reports a short write as RuntimeError
        error = write_error(what, root, nbytes(shared) + nbytes(own), e)
    try:
        everyone = agree(env, error, f"{what}: files written", written)  # rank 0 may seal and publish
        position.phase(f"{what}: publishing")
        if env.is_main:
            try:
                _seal(tmp, step, env.world_size, meta, {k: v for files in everyone for k, v in files.items()})
                _publish(tmp, final)
                _fsync_dir(root)
            except OSError as e:
                error = write_error(what, root, 4096, e)
        agree(env, error, f"{what}: published")
    except RunFailed:
        if env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # give the space back; nothing reads it
        raise
    if env.is_main:
        prune(root, keep, newest=step)
    return final


def _seal(tmp: Path, step: int, world_size: int, meta: dict, files: dict) -> None:
    """meta.json with every file's size and checksum (`files`: as the ranks wrote them), written last."""
    files = dict(sorted(files.items()))
    for name, want in files.items():  # (a size the file system does not show: refuse to publish it)
        if (tmp / name).stat().st_size != want["bytes"]:
            raise OSError(f"{name} holds {(tmp / name).stat().st_size} bytes, {want['bytes']} written")
    meta = {**meta, "format": FORMAT, "step": step, "world_size": world_size,
            "files": files, "saved_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    _write_durable(tmp / META, lambda f: f.write(json.dumps(meta, indent=1).encode()))
    _fsync_dir(tmp)


def _publish(tmp: Path, final: Path) -> None:
    """Rename tmp -> final. A rename cannot replace a non-empty directory, so an
    existing step-N (e.g. saved again after resuming from an older step) is moved
    aside first; a kill in between leaves the other checkpoints untouched."""
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """(step, dir) of every published checkpoint under `root`, oldest first."""
    if not Path(root).is_dir():
        return []
    found = [(int(m.group(1)), p) for p in Path(root).iterdir()
             if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found)


def prune(root: Path, keep: int, newest: int) -> None:
    """Keep the `keep` newest checkpoints up to step `newest` (the one just written,
    so never a damaged or abandoned later one in its place); drop leftovers of
    killed saves. Checkpoints after `newest` (left by a run resumed from an
    earlier step) are not this save's to judge and stay."""
    mine = [p for step, p in step_dirs(root) if step <= newest]
    for p in mine[:-keep]:
        shutil.rmtree(p, ignore_errors=True)
    for p in Path(root).iterdir():
        if p.name.startswith((".tmp-step-", ".old-step-")):
            shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------- reading
def problem(step_dir: Path, verify=None) -> str | None:
    """Why `step_dir` cannot be resumed from, or None when it is complete and intact: every file there at
    its size, and the checksums of those in `verify` (None: of every file) as written."""
    try:
        meta = json.loads((step_dir / META).read_text())
    except FileNotFoundError:
        return f"no {META} (the save did not finish)"
    except (OSError, ValueError) as e:
        return f"{META} unreadable ({e})"
    needed = [STATE] + [rank_file(r) for r in range(meta.get("world_size", 0))]
    files = meta.get("files", {})
    for name in needed:
        if name not in files:
            return f"{name} is not listed in {META}"
    for name, want in files.items():
        p = step_dir / name
        if not p.is_file():
            return f"{name} is missing"
        size = p.stat().st_size
        if size != want["bytes"]:
            return f"{name} has {size} bytes, {want['bytes']} expected (truncated?)"
        if (verify is None or name in verify) and _sha256(p) != want["sha256"]:
            return f"{name} does not match its checksum (corrupt)"
    return None


def newest(root: Path, verify=None, skip=()) -> Path | None:
    """The newest intact checkpoint under `root` but those in `skip` (`verify`: as problem's); damaged newer ones
    are skipped, loudly."""
    for _, p in reversed(step_dirs(root)):
        if p in skip:
            continue
        why = problem(p, verify)
        if why is None:
            return p
        log.warning("skipping checkpoint %s: %s; trying the one before it", p, why)
    return None


def read_meta(step_dir: Path) -> dict:
    return json.loads((Path(step_dir) / META).read_text())


def load(step_dir: Path, rank: int, device: torch.device, own=None, mapped: bool = False) -> tuple[dict, dict]:
    """(shared state, this rank's own state), tensors of the shared state on `device` (`mapped`: state.pt mapped
    on the CPU, a page read when touched). `own(step_dir)` reads this rank's part (default: its own file; see
    reshard.py)."""
    step_dir = Path(step_dir)
    try:
        shared = torch.load(step_dir / STATE, map_location="cpu" if mapped else device, weights_only=True,
                            mmap=mapped)
        mine = own(step_dir) if own else torch.load(step_dir / rank_file(rank),
                                                    map_location="cpu", weights_only=True)
    except FileNotFoundError as e:
        raise ConfigError(
            f"checkpoint {step_dir} is not readable on rank {rank} ({e.filename} missing): "
            "the run directory must be on a filesystem that every node shares") from e
    return shared, mine
