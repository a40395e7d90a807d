"""Opt-in machine tuning for CPU ranks on gloo: off unless asked for.

* ``dist.comm_threads=realtime|auto`` (default normal): gloo's threads (its
  socket loop and work queue) at real-time priority (SCHED_FIFO), so that a
  woken communication thread does not wait for the next scheduler tick behind
  a computing rank. It paid where the ranks fill every core of a small VM
  (docs/defaults.md, "dist.comm_threads"); `auto` turns it on only there.
* ``sync.poll=true|auto`` (default false): wait for the builtin all-reduce by
  polling (os.sched_yield) instead of sleeping. It paid on one CPU of three
  (docs/defaults.md, "sync.poll"); `auto` polls where the ranks fill the cores exactly.

Where cores are to spare a woken thread finds an idle one at once, while
real-time threads or spinning ranks take CPU from other people's work: hence
off by default. `start()` joins the process group (distributed.setup) and
applies what was asked, with one log line saying what it did; every rank gets
real-time threads or none (agree_across_ranks). What came of it travels in
DistEnv (env.comm_threads, env.poll); `allreduce(name, env)` is the all-reduce
a gradient sync or a benchmark calls, `plan_for(env)` the tuned collectives' plan.
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
from ddp_lab.collectives import TUNED, TunedPlan, get_algorithm
from ddp_lab.config import ConfigError
from ddp_lab.config.keys import TRI_STATE
from ddp_lab.distributed import ranks_on_machine, usable_cores
from ddp_lab.tuning.gloo_threads import (
    REALTIME_PRIORITY,
    at_comm_priority,
    below_realtime,
    policy,
    set_fifo,
    set_normal,
    thread_ids,
)
from ddp_lab.tuning.gloo_threads import (
    gloo_threads as find_gloo_threads,
)

log = logging.getLogger(__name__)

POLL = TRI_STATE  # sync.poll, as the schema has it



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


def asked(dist_cfg, poll) -> bool:
    """Whether this run asked for any machine tuning (else entry points join with distributed.setup)."""
    return dist_cfg.comm_threads != "normal" or check_choices(dist_cfg.comm_threads, poll) != "false"


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
        got = "realtime" if any(policy(t) == os.SCHED_FIFO for t in find_gloo_threads(thread_ids(), 0)) else "normal"
        return got, f"{wanted.why}; gloo's threads as the first job of this sweep left them", False
    if wanted.comm_threads == "normal":
        return "normal", wanted.why, False
    try:
        if not sys.platform.startswith("linux"):
            raise OSError(f"threads are found through /proc, which {sys.platform} has not")
        threads = find_gloo_threads(new_threads)
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

    The tuned ring cuts its chunks by the plan, so neighbours with different
    plans would send messages the other does not expect (gloo aborts); and a
    rank left at normal priority waits behind its real-time peers.
    """
    everyone = torch.tensor([1 if threads == "realtime" else 0])
    dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
    if threads == "realtime" and not everyone.item():
        set_normal(find_gloo_threads(thread_ids(), 0))
        return "normal", f"{why}; another rank's are at normal priority, so every rank's are", True
    return threads, why, False


def raise_late_threads() -> list[int]:
    """Real-time priority for every gloo thread of this process still without it.

    apply() waits at most a second for gloo's new threads to name themselves;
    one named later would keep normal priority among real-time peers and make
    its rank's all-reduce wait (docs/defaults.md, "dist.comm_threads"). By now
    agree_across_ranks' all-reduce has run, so gloo's threads are running and named.
    """
    late = below_realtime(find_gloo_threads(thread_ids(), 0))
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
