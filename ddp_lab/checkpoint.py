"""Checkpoints: save, find the newest complete one, validate, load, prune.

Layout, inside the run directory (shared by every rank and node):

    checkpoints/step-<N>/state.pt      rank 0: model, optimizer, LR schedule, grad scaler,
                                        epoch, batches done in the epoch, step, ...
    checkpoints/step-<N>/rank<R>.pt    every rank its own: RNG states and the partial
                                        epoch's running sums (they differ per rank)
    checkpoints/step-<N>/meta.json     rank 0, written last: world size, config and its
                                        hash, size and SHA-256 of every file above

Why it survives a kill at any moment: a checkpoint is written into
`.tmp-step-<N>/`, every file is fsynced, and only then is the directory
renamed to `step-<N>/` (one atomic rename) and its parent fsynced. A kill
before the rename leaves a temp dir that nobody reads; a kill after it leaves
a complete checkpoint. meta.json's checksums catch what the rename cannot
(a file damaged later, a copy cut short): such a checkpoint is skipped with a
warning in favour of the one before it.

Everything is read back with `torch.load(weights_only=True)`, so RNG states
are stored as tensors and plain lists, never as pickled Python objects.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv

log = logging.getLogger("ddp_lab")

DIRNAME = "checkpoints"
STATE = "state.pt"
META = "meta.json"
FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")

# The parts of the config that change the training math. A checkpoint made
# under other values would continue a different run, so resuming is refused.
# Left out on purpose (NOT_HASHED): where the data lives and how it is read,
# how LeNet lays out its arithmetic and how a rank waits for the allreduce
# (the same function either way); trainer.max_steps (stop early, continue
# later), logging, resume and checkpoint settings, dist.*. A checkpoint whose
# meta.json still holds such a key (written before it was left out) is
# compared without it.
HASHED_GROUPS = ("model", "data", "optim", "sync")
NOT_HASHED = {
    "model": ("crop_unused_border", "pad_channels_to"),
    "data": ("root", "cache_dir", "download", "loader", "num_workers"),
    "sync": ("poll",),
}
TRAINER_HASHED = ("epochs", "grad_accum", "amp")


def rank_file(rank: int) -> str:
    return f"rank{rank}.pt"


# ---------------------------------------------------------------- config hash
def config_subset(cfg) -> dict:
    """The hashed part of `cfg` as plain values (it goes into meta.json as well)."""
    c = OmegaConf.to_container(cfg, resolve=True)
    sub = _without_unhashed({g: c[g] for g in HASHED_GROUPS})
    sub["trainer"] = {k: c["trainer"][k] for k in TRAINER_HASHED}
    sub["seed"] = c["seed"]
    return sub


def _without_unhashed(subset: dict) -> dict:
    """`subset` with the NOT_HASHED keys of its groups dropped (a copy)."""
    return {g: ({k: v for k, v in part.items() if k not in NOT_HASHED.get(g, ())}
                if isinstance(part, dict) else part)
            for g, part in subset.items()}


def config_hash(subset: dict) -> str:
    return hashlib.sha256(json.dumps(subset, sort_keys=True).encode()).hexdigest()[:16]


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(saved: dict, now: dict) -> list[str]:
    """`key: <in checkpoint> -> <now>` for every hashed key that differs."""
    a, b = _flatten(saved), _flatten(now)
    missing = "(unset)"
    return [f"{k}: {a.get(k, missing)!r} in the checkpoint vs {b.get(k, missing)!r} now"
            for k in sorted(set(a) | set(b)) if a.get(k, missing) != b.get(k, missing)]


# ---------------------------------------------------------------- RNG states
def rng_state(device: torch.device) -> dict:
    """This process's RNG states in a form `torch.load(weights_only=True)` accepts."""
    version, internal, gauss = random.getstate()
    state = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    try:
        import numpy as np
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [name, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached]
    except ImportError:
        pass
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    if "numpy" in state:
        import numpy as np
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))


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


def _write_durable(path: Path, write) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _barrier(env: DistEnv) -> None:
    if not env.distributed:
        return
    if env.backend == "nccl":
        dist.barrier(device_ids=[env.device.index])
    else:
        dist.barrier()


def save(root: Path, step: int, env: DistEnv, own: dict, shared: dict | None,
         meta: dict | None, keep: int) -> Path:
    """Write checkpoint `step` from every rank; returns its final directory.

    Every rank calls this at the same step (the loop runs in lockstep), so the
    two barriers below always meet. `own` is this rank's state; `shared` and
    `meta` are rank 0's (None elsewhere).
    """
    root = Path(root)
    tmp, final = root / f".tmp-step-{step}", root / f"step-{step}"
    if env.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was killed
        tmp.mkdir()
    _barrier(env)  # the empty temp dir exists before any rank writes into it
    if not tmp.is_dir():
        raise RuntimeError(
            f"rank {env.rank} cannot see {tmp}, which rank 0 just created: the run directory "
            "must be on a filesystem that every node shares")
    _write_durable(tmp / rank_file(env.rank), lambda f: torch.save(own, f))
    if env.is_main:
        _write_durable(tmp / STATE, lambda f: torch.save(shared, f))
    _barrier(env)  # every rank's file is on disk: rank 0 may seal and publish
    if env.is_main:
        files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
                 for p in sorted(tmp.iterdir())}
        meta = {**meta, "format": FORMAT, "step": step, "world_size": env.world_size,
                "files": files, "saved_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        _write_durable(tmp / META, lambda f: f.write(json.dumps(meta, indent=1).encode()))
        _fsync_dir(tmp)
        _publish(tmp, final)
        _fsync_dir(root)
        prune(root, keep)
    return final


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
             if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found)


def prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints; drop leftovers of killed saves."""
    for _, p in step_dirs(root)[:-keep]:
        shutil.rmtree(p, ignore_errors=True)
    for p in Path(root).iterdir():
        if p.name.startswith((".tmp-step-", ".old-step-")):
            shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------- reading
def problem(step_dir: Path) -> str | None:
    """Why `step_dir` cannot be resumed from, or None when it is complete and intact."""
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
        if _sha256(p) != want["sha256"]:
            return f"{name} does not match its checksum (corrupt)"
    return None


def newest(root: Path) -> Path | None:
    """The newest intact checkpoint under `root`; damaged newer ones are skipped, loudly."""
    for _, p in reversed(step_dirs(root)):
        why = problem(p)
        if why is None:
            return p
        log.warning("skipping checkpoint %s: %s; trying the one before it", p, why)
    return None


def read_meta(step_dir: Path) -> dict:
    return json.loads((Path(step_dir) / META).read_text())


def validate(step_dir: Path, meta: dict, world_size: int, subset: dict) -> None:
    """Refuse a checkpoint of another world size or another training config."""
    problems, fixes = [], []
    if meta["world_size"] != world_size:
        problems.append(f"world size {meta['world_size']} in the checkpoint vs {world_size} now")
        fixes.append(f"launch {meta['world_size']} processes in all (nnodes x nproc_per_node)")
    saved = _without_unhashed(meta["config"])
    if config_hash(saved) != config_hash(subset):
        diff = config_diff(saved, subset)
        problems.append("config hash differs (" + "; ".join(diff) + ")")
        fixes.append("set those keys back to the checkpoint's values")
    if problems:
        raise ConfigError(
            f"cannot resume from {step_dir}: " + ", and ".join(problems) + ". Either "
            + " and ".join(fixes) + ", or start a new run directory (a new --rdzv_id or "
            "hydra.run.dir, with trainer.resume=none)")


def load(step_dir: Path, rank: int, device: torch.device) -> tuple[dict, dict]:
    """(shared state, this rank's own state), tensors of the shared state on `device`."""
    step_dir = Path(step_dir)
    try:
        shared = torch.load(step_dir / STATE, map_location=device, weights_only=True)
        own = torch.load(step_dir / rank_file(rank), map_location="cpu", weights_only=True)
    except FileNotFoundError as e:
        raise ConfigError(
            f"checkpoint {step_dir} is not readable on rank {rank} ({e.filename} missing): "
            "the run directory must be on a filesystem that every node shares") from e
    return shared, own


# ---------------------------------------------------------------- choosing
def _explicit(path: Path) -> Path:
    """trainer.resume=<path>: a step-N dir, or a checkpoints/ dir or run dir (its newest)."""
    if not path.exists():
        raise ConfigError(f"trainer.resume={path}: no such file or directory")
    if (path / META).exists() or _STEP_DIR.match(path.name):
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


def pick(resume: str, run_root: Path, restarted: bool) -> Path | None:
    """Which checkpoint to continue from, or None to start from scratch.

    A torchrun restart continues from the newest checkpoint of its own run
    (falling back on what the launch itself was told, if it died before its
    first save). Otherwise trainer.resume decides: none, auto (newest in this
    run directory, if any), or a path.
    """
    if restarted:
        found = newest(run_root)
        if found is not None:
            return found
    if resume == "none":
        if not restarted:
            _refuse_to_overwrite(run_root)
        return None
    if resume == "auto":
        return newest(run_root)
    return _explicit(Path(resume).expanduser())


def _refuse_to_overwrite(run_root: Path) -> None:
    """A fresh run must not overwrite what an earlier run left in the same directory."""
    held = []
    earlier = step_dirs(run_root)
    if earlier:
        held.append(f"checkpoints up to {earlier[-1][1].name}")
    if (run_root.parent / "model.pt").exists():
        held.append("model.pt")
    if held:
        raise ConfigError(
            f"{run_root.parent} already holds an earlier run ({', '.join(held)}), which a new "
            f"run there would overwrite. Continue it with trainer.resume=auto, or start afresh "
            f"in another directory (hydra.run.dir=...)")


def choose(resume: str, run_root: Path, env: DistEnv) -> Path | None:
    """pick() on rank 0, the answer (or its ConfigError) sent to every rank.

    One rank decides so that all ranks load the same step even if their views
    of the filesystem differ. "Restarted" is true if it is on ANY rank: after a
    failure, torchrun agents of healthy nodes restart their workers without
    counting it, so their TORCHELASTIC_RESTART_COUNT can still read 0.
    """
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if env.distributed:
        t = torch.tensor([restarts], dtype=torch.int64, device=env.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        restarts = int(t.item())
    answer = [None, None]  # [path, error]
    if env.is_main:
        try:
            found = pick(resume, run_root, restarts > 0)
            answer[0] = None if found is None else str(found)
        except ConfigError as e:
            answer[1] = str(e)
    if env.distributed:
        dist.broadcast_object_list(answer, src=0, device=env.device)
    if answer[1] is not None:
        raise ConfigError(answer[1])
    return None if answer[0] is None else Path(answer[0])
