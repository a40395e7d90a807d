"""Process-group setup: the one place that reads torchrun's environment.

The same entry point runs under `torchrun` (RANK, WORLD_SIZE, LOCAL_RANK set)
and as a plain `python -m ...` (a world of one, no process group at all).
On CPU ranks it also puts gloo's threads at real-time priority where it may
(dist.comm_threads, see schedule_comm_threads).
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ddp_lab import rendezvous
from ddp_lab.config import ConfigError

log = logging.getLogger(__name__)

COMM_THREADS = ("auto", "realtime", "normal")
# gloo's threads, by the names they give themselves: the socket event loop
# (gloo_tcp_loop) and the process group's work queue (pt_gloo_runloop).
GLOO_THREAD_PREFIXES = ("gloo", "pt_gloo")
REALTIME_PRIORITY = 1  # the lowest SCHED_FIFO priority already runs ahead of every normal thread
_comm_threads_of_group = "normal"  # what schedule_comm_threads gave the live group's threads


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str  # "gloo", "nccl", or "none" for a single process without torchrun
    comm_threads: str = "normal"  # the scheduling gloo's threads got: "realtime" or "normal"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend != "none"


def resolve_backend(requested: str, device: torch.device) -> str:
    """auto -> nccl on CUDA, gloo otherwise; reject combinations that cannot work."""
    if requested == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if requested not in ("gloo", "nccl"):
        raise ConfigError(f"dist.backend={requested!r} is not one of auto, gloo, nccl")
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
    if requested != "cuda":
        raise ConfigError(f"dist.device={requested!r} is not one of auto, cpu, cuda")
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


def setup(backend: str = "auto", device: str = "auto", timeout_s: float = 300,
          comm_threads: str = "auto") -> DistEnv:
    """Join the process group torchrun described, or run alone without one."""
    if comm_threads not in COMM_THREADS:
        raise ConfigError(f"dist.comm_threads={comm_threads!r} is not one of {', '.join(COMM_THREADS)}")
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    dev = pick_device(device, local_rank)
    chosen = resolve_backend(backend, dev)
    if "RANK" not in os.environ:  # plain `python -m`: nothing to join
        return DistEnv(0, 1, 0, dev, "none")
    if dist.is_initialized():  # the next job of a sweep (see teardown)
        if dist.get_backend() != chosen:
            raise ConfigError(f"dist.backend={chosen} but this launch's process group is "
                              f"{dist.get_backend()}: a sweep cannot change the backend; "
                              "launch one torchrun per backend")
        return DistEnv(rank, world_size, local_rank, dev, chosen, comm_threads_of_group())
    before = thread_ids()
    # Through a store prefix of this attempt's own (see ddp_lab.rendezvous), so that a
    # torchrun restart never reads a failed attempt's keys. NCCL binds the communicator
    # to this rank's GPU up front.
    rendezvous.init_process_group(chosen, rank, world_size, timeout_s,
                                  device_id=dev if chosen == "nccl" else None)
    got = schedule_comm_threads(comm_threads, chosen, dev, thread_ids() - before)
    return DistEnv(rank, world_size, local_rank, dev, chosen, got)


def comm_threads_of_group() -> str:
    """What schedule_comm_threads last gave the live group's threads."""
    return _comm_threads_of_group


def schedule_comm_threads(requested: str, backend: str, device: torch.device,
                          new_threads: set[int]) -> str:
    """dist.comm_threads: give gloo's threads real-time priority (SCHED_FIFO).

    Why: a gloo allreduce passes through several threads (the socket loop
    wakes the work queue, which wakes the waiting rank). On a busy CPU a woken
    normal thread can wait for the next scheduler tick before it runs: on the
    2-core development VM (HZ=250) a 0.5 MB allreduce after 18 ms of computing
    took a median 0.55-0.8 ms but a mean 1.4-2.1 ms, over 2 ms one time in
    four. With gloo's threads at SCHED_FIFO: a median 0.37-0.42 ms, mean
    0.38-0.43, never over 2 ms. The threads sleep until there is work, so they take no CPU they do
    not need.

    The hand-written algorithms post gloo's sends and receives from the
    training thread, which then holds a connection's lock for a moment: see
    at_comm_priority for what they need in turn.

    auto: realtime for gloo on CPU ranks where this process may (root,
    CAP_SYS_NICE, or `ulimit -r` of 1 or more), else normal, with a warning.
    realtime: the same, but failing is an error. normal: leave them be.
    Returns what the threads got.
    """
    got = _schedule_comm_threads(requested, backend, device, new_threads)
    global _comm_threads_of_group
    _comm_threads_of_group = got
    return got


def _schedule_comm_threads(requested: str, backend: str, device: torch.device,
                           new_threads: set[int]) -> str:
    if requested == "normal" or backend != "gloo":
        if requested == "realtime":
            raise ConfigError(f"dist.comm_threads=realtime schedules gloo's threads, but this run uses "
                              f"{backend}: use dist.comm_threads=auto or normal")
        return "normal"
    if requested == "auto" and device.type != "cpu":
        return "normal"  # CUDA ranks wait on the GPU, not on a busy CPU
    try:
        if not sys.platform.startswith("linux"):
            raise OSError(f"threads are found through /proc, which {sys.platform} has not")
        threads = gloo_threads(new_threads)
        if not threads:
            raise OSError("found no gloo threads among those the process group started")
        set_fifo(threads, REALTIME_PRIORITY)
    except OSError as e:
        why = (f"could not give gloo's threads real-time priority ({e}); it needs Linux and "
               "root, CAP_SYS_NICE (docker run --cap-add=SYS_NICE) or `ulimit -r 1`")
        if requested == "realtime":
            raise ConfigError(f"dist.comm_threads=realtime: {why}; or use dist.comm_threads=normal") from e
        log.warning("%s. Continuing at normal priority: allreduces may now and then wait a "
                    "scheduler tick (dist.comm_threads=normal silences this)", why)
        return "normal"
    return "realtime"


def thread_ids() -> set[int]:
    """This process's threads (Linux: /proc/self/task); empty elsewhere."""
    if not sys.platform.startswith("linux"):
        return set()
    return {int(t) for t in os.listdir("/proc/self/task")}


def thread_name(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except FileNotFoundError:  # the thread ended meanwhile
        return ""


def gloo_threads(new: set[int], wait_s: float = 1.0) -> list[int]:
    """Which of the threads the process group started are gloo's.

    A new thread carries the name of the one that started it until it names
    itself, so wait a little for gloo's to do so: missing one would leave it at
    normal priority among real-time peers (see set_fifo)."""
    deadline = time.monotonic() + wait_s
    while True:
        names = {tid: thread_name(tid) for tid in sorted(new)}
        gloo = [tid for tid, name in names.items() if name.startswith(GLOO_THREAD_PREFIXES)]
        if len(gloo) == len([n for n in names.values() if n]) or time.monotonic() > deadline:
            return gloo
        time.sleep(0.01)


def set_fifo(threads: list[int], priority: int) -> None:
    """All or nothing: a gloo thread left at normal priority while its peers run
    real-time was seen to starve them for ~1 s (the kernel's real-time throttle),
    so on failure the ones already changed go back to normal."""
    done = []
    try:
        for tid in threads:
            os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(priority))
            done.append(tid)
    except OSError:
        for tid in done:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        raise


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
    global _comm_threads_of_group
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _comm_threads_of_group = "normal"  # the threads went with the group


def all_reduce_sum(t: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """In-place SUM across ranks (a no-op for a single process)."""
    if env.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_agree(flag: bool, env: DistEnv) -> bool:
    """True when `flag` is true on every rank: lets one rank's failure stop all."""
    if not env.distributed:
        return flag
    t = torch.tensor([0 if flag else 1], dtype=torch.int32, device=env.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return int(t.item()) == 0


@contextlib.contextmanager
def at_comm_priority():
    """Run the block with the calling thread at the priority gloo's threads have.

    For the hand-written algorithms, which call gloo's send and recv from this
    thread: each call holds the connection's lock for a moment, and gloo's
    socket thread, finding it taken, tries again at once. At real-time
    priority it would never let a normal thread run to release it (a 1 MiB
    ring all-reduce took 50 ms instead of 0.3). At the same real-time priority
    neither preempts the other. Nothing changes where gloo's threads are at
    normal priority; nested blocks keep the outer one's priority. Any other
    code that calls dist.send/recv/isend/irecv on a gloo group should do so
    inside this block too (collectives such as dist.all_reduce need not:
    gloo runs them in its own threads).
    """
    policy = os.sched_getscheduler(0) if _comm_threads_of_group == "realtime" else None
    if policy is None or policy == os.SCHED_FIFO:
        yield
        return
    param = os.sched_getparam(0)
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)
