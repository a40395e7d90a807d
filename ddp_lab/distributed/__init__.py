"""Process-group setup: the one place that reads torchrun's environment.

The same entry point runs under `torchrun` (RANK, WORLD_SIZE, LOCAL_RANK set)
and as a plain `python -m ...` (a world of one, no process group at all).
Entry points call setup() here; machine tuning on top of the group
(dist.comm_threads, sync.poll) is opt-in, in ddp_lab.tuning.
"""
from __future__ import annotations

import atexit
import gc
import glob
import importlib
import logging
import os
import sys
import traceback
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist

# (before any group: its functions take the default group as a default argument when first imported, and
# imported after it, by fsdp or DTensor, they held the group past destroy_process_group)
import torch.distributed.nn.functional  # noqa: F401

from ddp_lab.config import ConfigError
from ddp_lab.distributed import rendezvous


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str  # "gloo", "nccl", or "none" for a single process without torchrun
    # What opt-in machine tuning (ddp_lab.tuning) gave this rank: gloo's threads'
    # scheduling ("realtime" or "normal") and whether it polls for the builtin allreduce.
    comm_threads: str = "normal"
    poll: bool = False
    # The ranks this env's collectives span: None, the whole world; a process group (sync.islands: the
    # ranks of one island, or rank i of every island), rank and world_size then counted within it.
    group: object = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend != "none"


# Set by ddp_lab.tools.cluster in every worker's environment: how many ranks all the
# emulated hosts run on this machine's cores (LOCAL_WORLD_SIZE counts one host's).
RANKS_ON_MACHINE_ENV = "DDP_LAB_RANKS_ON_MACHINE"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), else all of them."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def ranks_on_machine(world_size: int) -> int:
    """How many ranks share this machine's cores: torchrun's LOCAL_WORLD_SIZE, or
    more where ddp_lab.tools.cluster runs several emulated hosts on the same cores."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return max(local, int(os.environ.get(RANKS_ON_MACHINE_ENV, "0")))


def resolve_backend(requested: str, device: torch.device) -> str:
    """auto -> nccl on CUDA, gloo otherwise; reject combinations that cannot work."""
    if requested == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if requested == "nccl" and device.type != "cuda":
        raise ConfigError(
            "dist.backend=nccl needs CUDA devices, but this rank runs on "
            f"{device}; use dist.backend=gloo (or auto) for CPU training"
        )
    return requested


def pick_device(requested: str, local_rank: int) -> torch.device:
    """device=auto|cpu|cuda. On CUDA each rank takes the GPU of its LOCAL_RANK."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("dist.device=cuda but no CUDA device is visible; use dist.device=cpu")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise ConfigError(
            f"LOCAL_RANK={local_rank} but only {count} CUDA device(s) are visible: "
            f"launch at most {count} processes per node, or use dist.device=cpu"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


LAUNCH = ("launch with torchrun, which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT "
          "(or unset RANK to run one process)")


def _env_int(name: str, default: int, least: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = least - 1
    if number < least:
        raise ConfigError(f"{name}={value} must be an integer >= {least}; {LAUNCH}")
    return number


def launch_env() -> tuple[int, int, int, bool]:
    """(rank, world size, local rank, whether to join a group) from torchrun's variables,
    refused in one line where they cannot describe a launch: a rank outside the world
    would wait for a store or peers that never come."""
    rank, world_size = _env_int("RANK", 0, 0), _env_int("WORLD_SIZE", 1, 1)
    local_rank = _env_int("LOCAL_RANK", 0, 0)
    if "RANK" not in os.environ:  # plain `python -m`: nothing to join
        return 0, 1, local_rank, False
    if "WORLD_SIZE" not in os.environ:
        raise ConfigError(f"RANK={rank} is set but WORLD_SIZE is not; {LAUNCH}")
    if rank >= world_size:
        raise ConfigError(f"RANK={rank} with WORLD_SIZE={world_size}: a rank must be below the world "
                          f"size (0..{world_size - 1}); {LAUNCH}")
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing and world_size > 1:
        raise ConfigError(f"WORLD_SIZE={world_size} but {' and '.join(missing)} "
                          f"{'is' if len(missing) == 1 else 'are'} not set: the ranks meet at "
                          f"MASTER_ADDR:MASTER_PORT; {LAUNCH}")
    if not missing:
        _env_int("MASTER_PORT", 0, 1)
    return rank, world_size, local_rank, not missing  # a world of one with no store: alone


def setup(backend: str = "auto", device: str = "auto", timeout_s: float = 300) -> DistEnv:
    """Join the process group torchrun described, or run alone without one."""
    rank, world_size, local_rank, join = launch_env()
    dev = pick_device(device, local_rank)
    chosen = resolve_backend(backend, dev)
    if not join:
        return DistEnv(0, 1, 0, dev, "none")
    if dist.is_initialized():  # the next job of a sweep (see teardown)
        if dist.get_backend() != chosen:
            raise ConfigError(f"dist.backend={chosen} but this launch's process group is "
                              f"{dist.get_backend()}: a sweep cannot change the backend; "
                              "launch one torchrun per backend")
        return DistEnv(rank, world_size, local_rank, dev, chosen)
    # Through a store prefix of this attempt's own (see ddp_lab.distributed.rendezvous), so that a
    # torchrun restart never reads a failed attempt's keys. NCCL binds the communicator
    # to this rank's GPU up front.
    rendezvous.init_process_group(chosen, rank, world_size, timeout_s,
                                  device_id=dev if chosen == "nccl" else None)
    return DistEnv(rank, world_size, local_rank, dev, chosen)


def teardown(keep_for_next_job: bool = False) -> None:
    """Destroy the process group if there is one; safe to call on any exit path.

    keep_for_next_job: a Hydra sweep (-m) runs its jobs one after another in
    the same processes. Destroying and re-creating the group between them would
    reuse the first group's keys in torchrun's store, where the old peer
    addresses still stand, and ranks could connect to ports long closed. So a
    sweep keeps one group for all its jobs, destroyed when the process exits.
    """
    if keep_for_next_job:
        atexit.register(_destroy)  # registering twice is harmless: _destroy checks
        return
    _destroy()


def _destroy() -> None:
    if dist.is_available() and dist.is_initialized():
        # A run's DDP model sits in reference cycles (a Trainer's callbacks hold its sync) that hold the
        # group, and torch's DTensor caches hold fsdp's mesh: both let go first, so that
        # destroy_process_group really ends it (else gloo's threads ran on into the interpreter's exit)
        _empty_dtensor_caches()
        gc.collect()
        dist.destroy_process_group()


# torch's caches that keep each device mesh a DTensor used (sharding rules, redistribution plans, the
# mesh's topology), as (module, what empties it); one this torch lacks is passed over (exit_finished
# then still leaves safely)
DTENSOR_CACHES = (("torch.distributed.tensor.debug", "_clear_sharding_prop_cache"),
                  ("torch.distributed.tensor._redistribute", "clear_redistribute_planner_cache"),
                  ("torch.distributed.tensor._redistribute", "_gen_transform_infos.cache_clear"),
                  ("torch.distributed.tensor._collective_utils", "MeshTopoInfo.build_from_mesh.cache_clear"))


def _empty_dtensor_caches() -> None:
    if "torch.distributed.tensor" not in sys.modules:  # (no DTensor made: nothing cached)
        return
    for module, path in DTENSOR_CACHES:
        try:
            empty = importlib.import_module(module)
            for name in path.split("."):
                empty = getattr(empty, name)
        except (ImportError, AttributeError):
            continue
        empty()


# What torch and gloo name the threads of a gloo process group (ProcessGroupGloo's workers, its
# transport's event loop), as Linux lists them under /proc/self/task.
GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")


def gloo_threads_left() -> list[str]:
    """The gloo threads this process still runs ([] where /proc/self/task is not there)."""
    names = []
    for path in glob.glob("/proc/self/task/*/comm"):
        try:
            with open(path) as f:
                names.append(f.read().strip())
        except OSError:  # a thread that ended meanwhile
            pass
    return sorted(n for n in names if n in GLOO_THREADS)


def exit_finished() -> None:
    """The last call of a rank whose run finished: destroy the group (a sweep's too), then exit 0.

    Where gloo's threads still outlive destroy_process_group (something holding the group: a
    cache of another torch's than the ones _destroy empties), the group would end only as the
    interpreter shuts down, the order torch warns against (a finished rank aborted with
    "terminate called without an active exception"): such a rank runs its atexit handlers and
    leaves without that shutdown.
    """
    _destroy()
    if gloo_threads_left():
        _exit_now(0)


def clear_frames(exc: BaseException | None) -> None:
    """Drop the locals of the finished frames `exc` (and what it was raised from or during) passed through.

    A failed run's traceback holds Trainer.fit's `self`, and with it the group, until the interpreter's
    shutdown; cleared, the trainer is garbage before teardown, as a finished run's is."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)  # (frames still running are skipped)
        exc = exc.__cause__ or exc.__context__


def exit_failed(exc: BaseException) -> None:
    """The last call of a rank whose run raised `exc` (an error, sys.exit, a signal's exit), as exit_finished;
    it returns where the caller may re-raise `exc` to the interpreter.

    Where gloo's threads still run (as in exit_finished), the rank leaves as the interpreter would (the
    traceback printed, its atexit handlers run, exit 1; SystemExit's own code), without its shutdown.
    """
    _destroy()
    if not gloo_threads_left():
        return
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        _exit_now(code or 0)
    sys.excepthook(type(exc), exc, exc.__traceback__)
    _exit_now(130 if isinstance(exc, KeyboardInterrupt) else 1)


def _exit_now(code: int) -> NoReturn:
    logging.getLogger("ddp_lab").debug("gloo threads %s outlived destroy_process_group: exit %d without "
                                       "the interpreter's shutdown", gloo_threads_left(), code)
    atexit._run_exitfuncs()  # what the interpreter runs before its shutdown (logging's shutdown among them)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def all_reduce_sum(t: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """In-place SUM across ranks (a no-op for a single process)."""
    if env.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t
