"""Process-group setup: the one place that reads torchrun's environment.

The same entry point runs under `torchrun` (RANK, WORLD_SIZE, LOCAL_RANK set)
and as a plain `python -m ...` (a world of one, no process group at all).
Entry points call setup() here, and on their way out teardown() and
exit_finished() or exit_failed() (leaving.py); machine tuning on top of the
group (dist.comm_threads, sync.poll) is opt-in, in ddp_lab.tuning.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

# (before any group: its functions take the default group as a default argument when first imported, and
# imported after it, by fsdp or DTensor, they held the group past destroy_process_group: leaving.py)
import torch.distributed.nn.functional  # noqa: F401

from ddp_lab.config import ConfigError
from ddp_lab.distributed import rendezvous
from ddp_lab.distributed.leaving import (  # noqa: F401  (the entry points' last calls: leaving.py)
    clear_frames,
    exit_failed,
    exit_finished,
    gloo_threads_left,
    teardown,
)


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


def all_reduce_sum(t: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """In-place SUM across ranks (a no-op for a single process)."""
    if env.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t
