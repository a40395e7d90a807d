"""gloo's threads: finding them among a process's threads by the names they
give themselves, and changing how they are scheduled.

ddp_lab.tuning (opt-in) decides whether they get real-time priority and calls these;
the hand-written all-reduces run inside at_comm_priority so that the thread
posting gloo's messages has the same priority as gloo's own (see there).
"""
from __future__ import annotations

import contextlib
import os
import sys
import time

# gloo's threads, by the names they give themselves: the socket event loop
# (gloo_tcp_loop) and the process group's work queue (pt_gloo_runloop).
GLOO_THREAD_PREFIXES = ("gloo", "pt_gloo")
REALTIME_PRIORITY = 1  # the lowest SCHED_FIFO priority already runs ahead of every normal thread


def thread_ids() -> set[int]:
    """This process's threads (Linux: /proc/self/task); empty elsewhere."""
    if not sys.platform.startswith("linux"):
        return set()
    return {int(t) for t in os.listdir("/proc/self/task")}


def thread_name(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
        return ""


def policy(tid: int) -> int | None:
    try:
        return os.sched_getscheduler(tid)
    except OSError:  # the thread ended meanwhile
        return None


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


def below_realtime(threads: list[int]) -> list[int]:
    """Those of `threads` not at real-time priority (SCHED_FIFO); ended ones left out."""
    return [tid for tid in threads if policy(tid) not in (os.SCHED_FIFO, None)]


def set_fifo(threads: list[int], priority: int) -> None:
    """All or nothing: a gloo thread left at normal priority while its peers run
    real-time was seen to starve them for ~1 s (the kernel's real-time throttle),
    so on failure the ones already changed go back to normal. A thread that has
    ended meanwhile is no failure: gloo starts short-lived threads while it
    connects."""
    done = []
    try:
        for tid in threads:
            try:
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(priority))
            except ProcessLookupError:
                continue
            done.append(tid)
    except OSError:
        set_normal(done)
        raise


def set_normal(threads: list[int]) -> None:
    """Back to normal priority, skipping threads that have ended."""
    for tid in threads:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


@contextlib.contextmanager
def at_comm_priority(realtime: bool):
    """Run the block with the calling thread at real-time priority if gloo's
    threads have it (realtime=True); nothing changes otherwise.

    For the hand-written all-reduces, which call gloo's send and recv from this
    thread: each call holds the connection's lock for a moment, and gloo's
    socket thread, finding it taken, tries again at once. At real-time priority
    it would never let a normal thread run to release it (a ring all-reduce
    took hundreds of times as long). At the same real-time priority neither
    preempts the other. Nested blocks keep the outer one's priority.
    """
    policy = os.sched_getscheduler(0) if realtime else None
    if policy is None or policy == os.SCHED_FIFO:
        yield
        return
    param = os.sched_getparam(0)
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)
