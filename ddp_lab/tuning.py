"""Machine tuning: every setting that exists because of the machine a run is on.

There are two, both for CPU ranks on gloo, decided and applied once, at
start-up, by `start()`, which logs one line saying what it did:

* ``dist.comm_threads=auto|realtime|normal``: gloo's threads (its socket loop
  and its work queue) at real-time priority (SCHED_FIFO). An allreduce passes
  from thread to thread, and on a CPU busy computing a woken normal thread can
  wait for the next scheduler tick. On a 2-core Zen 5 VM (2026-11-23, HZ=250)
  a 0.5 MB allreduce after 18 ms of computing took a median 0.55-0.8 ms (a
  mean of 1.4-2.1, over 2 ms one time in four) at normal priority, 0.37-0.42
  ms (never over 2 ms) at real-time priority, and 2 ranks of LeNet trained at
  23,493-23,904 against 20,868-22,457 images/s (3 alternated pairs). On a
  2-core Zen 1 VM (AVX2, no bf16) gloo's all-reduce alone, its threads at
  normal priority, ran at 0.15-0.18x of its speed at real-time priority at
  4-64 KiB, 0.28-0.35x at 1 MiB, 0.66-0.67x at 4 MiB (2 ranks; 3 ranks
  0.25-0.26x, 0.48x, 0.79x; both in the same shuffled rounds, each twice).
* ``sync.poll=auto|true|false`` (default false): CPU ranks wait for the
  builtin allreduce by asking whether it is done, yielding the CPU between
  questions (os.sched_yield), instead of sleeping until gloo wakes them. On
  the same VM a 0.5 MB allreduce took a median 0.45 ms back to back but 2.1
  ms right after 20 ms of computing, and polling made 2 ranks of LeNet train
  10% faster with sync.mode=flat (within the noise with ddp). On the Zen 1
  VM, 2 ranks of LeNet with both settings on against both off (1 epoch, 5
  alternated pairs): a median 3,060 against 2,987 images/s, 0.65-1.20x per
  pair: not told apart from the noise there. With 3 ranks on its 2 cores,
  polling cost 15-25%: 2,084-2,495 images/s against 2,608-2,869 without
  (record 2026-11-25_zen1-2c_poll-3-ranks), so `auto` polls only where the
  ranks fill the cores exactly. On a 2-core Zen 4, 2 ranks: 10,142 against
  10,464 images/s with real-time threads, 8,972 against 8,535 without
  (medians of 4 shuffled rounds; record 2026-11-25_zen4-2c_poll-2-ranks).
  Paying on one CPU of three, it is off unless asked for.

Both address a woken thread waiting for a core that the ranks keep busy, as
on those 2-core VMs; ``auto`` turns them on only where this launch's ranks
fill every core the process may run on (the ranks on this machine >= the
cores in its affinity mask; polling, where asked for with auto, only where
they are equal), and the log line says so. The ranks on this machine are torchrun's LOCAL_WORLD_SIZE, or
more where ddp_lab.cluster runs several emulated hosts on the same cores
(ranks_on_machine). Where cores are to spare (a shared 64-core node, a container on one) a
woken thread should find an idle core at once (no such machine was
measured), while real-time threads, or ranks spinning, would take CPU from
other people's work. Every rank gets real-time threads or none
(agree_across_ranks).

What came of it travels with each rank's DistEnv (env.comm_threads, env.poll).
The rest of the code gets it by argument: `allreduce(name, env)` is the
all-reduce a gradient sync or a benchmark calls, and `plan_for(env)` is the
plan the tuned collectives take.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist

from ddp_lab import distributed
from ddp_lab.cluster.sharing import RANKS_ON_MACHINE_ENV, usable_cores
from ddp_lab.collectives import TUNED, TunedPlan, get_algorithm
from ddp_lab.config import ConfigError
from ddp_lab.gloo_threads import (
    REALTIME_PRIORITY,
    at_comm_priority,
    below_realtime,
    gloo_threads,
    policy,
    set_fifo,
    set_normal,
    thread_ids,
)

log = logging.getLogger(__name__)

COMM_THREADS = ("auto", "realtime", "normal")
POLL = ("auto", "true", "false")



class Decision(NamedTuple):
    comm_threads: str  # "realtime" | "normal": what gloo's threads are to get
    poll: bool
    why: str  # for the log line


def check_choices(comm_threads: str, poll) -> str:
    """sync.poll as one of POLL (dist.comm_threads is checked by the schema)."""
    value = str(poll).lower()  # YAML's true/false arrive as booleans
    if value not in POLL:
        raise ConfigError(f"sync.poll={poll!r} is not one of {', '.join(POLL)}")
    return value


def decide(comm_threads: str, poll, *, backend: str, device_type: str,
           machine_ranks: int, cores: int) -> Decision:
    """What dist.comm_threads and sync.poll come to for this rank (no side effects)."""
    poll = check_choices(comm_threads, poll)
    if comm_threads == "realtime" and backend != "gloo":
        raise ConfigError(f"dist.comm_threads=realtime schedules gloo's threads, but this run uses "
                          f"{backend}: use dist.comm_threads=auto or normal")
    if backend != "gloo" or device_type != "cpu":
        return Decision("normal", False, f"{backend} on {device_type}: nothing to tune")
    fills = machine_ranks >= cores
    ranks = f"{machine_ranks} rank{'s' if machine_ranks != 1 else ''} on this machine"
    if fills:
        why = f"{ranks} fill the {cores} cores this process may use"
    else:
        why = f"{ranks} leave {cores - machine_ranks} of {cores} cores free"
    threads = "realtime" if comm_threads == "realtime" or (comm_threads == "auto" and fills) else "normal"
    # Polling only where the ranks fill the cores exactly: with more ranks than
    # cores a rank spinning for its all-reduce takes the CPU from one computing.
    polls = poll == "true" or (poll == "auto" and machine_ranks == cores)
    return Decision(threads, polls, f"dist.comm_threads={comm_threads} sync.poll={poll}: {why}")


def ranks_on_machine(world_size: int) -> int:
    """How many ranks share this machine's cores: torchrun's LOCAL_WORLD_SIZE, or
    what ddp_lab.cluster's launcher says (RANKS_ON_MACHINE_ENV) where its
    emulated hosts share them.

    Counting one host's ranks, 8 hosts x 1 rank on 2 cores ran gloo's threads
    at normal priority, as if each host had the cores to itself: at 1 Gbit/s,
    4 MiB, shuffled rounds (Zen 1, 2026-11-25) gloo's all-reduce reached 92.7%
    of the link, the ring 88.1%, halving-doubling 81.7%; at real-time priority
    93.4%, 92.8% (with the ring's segments across hosts) and 86.8% (records
    cluster-8-hosts-interleaved and cluster-realtime).
    """
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return max(local, int(os.environ.get(RANKS_ON_MACHINE_ENV, "0")))


def start(dist_cfg, poll="false") -> distributed.DistEnv:
    """Join the process group (distributed.setup) and tune this machine for it.

    The one start-up call of every entry point; logs one line saying what it did.
    dist_cfg: the `dist` config group; poll: sync.poll (false where nothing polls).
    """
    check_choices(dist_cfg.comm_threads, poll)  # before any rank waits for another
    before = None if dist.is_initialized() else thread_ids()  # a sweep's next job: the group is there
    env = distributed.setup(dist_cfg.backend, dist_cfg.device, dist_cfg.timeout_s)
    if not env.distributed:
        return env  # one process: no group, nothing to tune
    wanted = decide(dist_cfg.comm_threads, poll, backend=env.backend, device_type=env.device.type,
                    machine_ranks=ranks_on_machine(env.world_size),
                    cores=usable_cores())
    new_threads = None if before is None else thread_ids() - before
    threads, why, refused = apply(wanted, dist_cfg.comm_threads, new_threads)
    if env.backend == "gloo":
        threads, why, overruled = agree_across_ranks(threads, why)
        refused = refused or overruled
        if threads == "realtime" and raise_late_threads():
            why += "; a gloo thread that named itself late raised too"
    env = dataclasses.replace(env, comm_threads=threads, poll=wanted.poll)
    line = (f"machine tuning: gloo's threads at {'real-time' if threads == 'realtime' else 'normal'} "
            f"priority, {'polling' if env.poll else 'no polling'} ({why})")
    level = logging.WARNING if refused else logging.INFO
    log.log(level if env.local_rank == 0 else logging.DEBUG, "%s", line)
    return env


def apply(wanted: Decision, requested: str, new_threads: set[int] | None) -> tuple[str, str, bool]:
    """Give gloo's threads what `wanted` says: (what they got, why, refused).

    new_threads: the threads the process group started; None where the group
    was already there (the next job of a sweep): its threads keep what they got.
    Failing to set real-time priority is an error if it was asked for
    (dist.comm_threads=realtime); under auto the threads stay at normal
    priority, and refused=True makes the log line a warning.
    """
    if new_threads is None:
        got = "realtime" if any(policy(t) == os.SCHED_FIFO for t in gloo_threads(thread_ids(), 0)) else "normal"
        return got, f"{wanted.why}; gloo's threads as the first job of this sweep left them", False
    if wanted.comm_threads == "normal":
        return "normal", wanted.why, False
    try:
        if not sys.platform.startswith("linux"):
            raise OSError(f"threads are found through /proc, which {sys.platform} has not")
        threads = gloo_threads(new_threads)
        if not threads:
            raise OSError("found no gloo threads among those the process group started")
        set_fifo(threads, REALTIME_PRIORITY)
    except OSError as e:
        refusal = (f"could not give gloo's threads real-time priority ({e}); it needs Linux and "
                   "root, CAP_SYS_NICE (docker run --cap-add=SYS_NICE) or `ulimit -r 1`")
        if requested == "realtime":
            raise ConfigError(f"dist.comm_threads=realtime: {refusal}; or use dist.comm_threads=normal") from e
        return "normal", f"{wanted.why}; {refusal}; dist.comm_threads=normal silences this", True
    return "realtime", wanted.why, False


def agree_across_ranks(threads: str, why: str) -> tuple[str, str, bool]:
    """Real-time threads on every rank or on none: (threads, why, overruled).

    The tuned ring cuts its chunks by the plan (ring.ring_plan), so two
    neighbours with different plans send messages of sizes the other does
    not expect: gloo aborted the process when one of 4 emulated hosts was
    refused real-time priority (2026-11-25). And on one machine a rank left
    at normal priority waits behind its real-time peers.
    """
    everyone = torch.tensor([1 if threads == "realtime" else 0])
    dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
    if threads == "realtime" and not everyone.item():
        set_normal(gloo_threads(thread_ids(), 0))
        return "normal", f"{why}; another rank's are at normal priority, so every rank's are", True
    return threads, why, False


def raise_late_threads() -> list[int]:
    """Real-time priority for every gloo thread of this process still without it.

    apply() waits at most a second for gloo's new threads to name themselves;
    one still unnamed then kept normal priority among real-time peers, and
    its rank's all-reduce waited 14-60 ms a step instead of 1-3 (2 LeNet
    ranks on a 2-core Zen 4, 2026-11-25: caught as gloo_tcp_loop at normal
    priority in 1 of 3 runs of one study; record 2026-11-25_zen4-2c_cluster).
    By now agree_across_ranks' all-reduce has run, so gloo's threads are
    running and named.
    """
    late = below_realtime(gloo_threads(thread_ids(), 0))
    set_fifo(late, REALTIME_PRIORITY)
    return late


# ------------------------------------------------------- what the others call


def plan_for(env: distributed.DistEnv) -> TunedPlan:
    """The plan the tuned collectives get on this rank. The ranks span hosts where
    torchrun started fewer of them on this node than there are (LOCAL_WORLD_SIZE)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))
    return TunedPlan(realtime_threads=env.comm_threads == "realtime", across_hosts=local < env.world_size)


def allreduce(name: str, env: distributed.DistEnv) -> Callable[..., torch.Tensor]:
    """The all-reduce `name` (ddp_lab.collectives) as this rank should run it:
    builtin waiting by polling where env.poll; a hand-written one with this
    rank's plan, each call at the priority gloo's threads have."""
    if name == "builtin" and env.poll:
        return polling_allreduce
    fn = get_algorithm(name, plan_for(env) if name in TUNED else None)
    if name == "builtin" or env.comm_threads != "realtime":
        return fn

    @functools.wraps(fn)
    def at_priority(tensor: torch.Tensor, group=None) -> torch.Tensor:
        with at_comm_priority(True):
            return fn(tensor, group)
    return at_priority


def wait_polling(done: Callable[[], bool]) -> None:
    """Return once done() is true, yielding the CPU between checks but never sleeping."""
    while not done():
        os.sched_yield()


def polling_allreduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """dist.all_reduce(SUM) that waits by polling (sync.poll)."""
    if dist.get_world_size(group) > 1:
        work = dist.all_reduce(tensor, group=group, async_op=True)
        wait_polling(work.is_completed)
        work.wait()  # raises what the allreduce raised, if anything
    return tensor
