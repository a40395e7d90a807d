"""Where each rank is: the marks its training thread leaves, and the lines they make.

A collective waits for its slowest rank, and a rank that hangs (a stuck
kernel, a dead NFS mount, a stopped process) or skips a collective (a
desync) leaves every other rank waiting with nothing to say but a timeout.
So the training thread marks its place, from start-up to exit:

* `at_step(n)` as optimizer step n begins;
* `phase("data loading")` for each stretch of its own work (loading data,
  compiling, forward/backward, evaluation, writing a checkpoint, ...), and
  `progress()` inside a long one (each evaluation batch);
* `with collective("gradient sync"): ...` around every collective (the
  gradient sync, the epoch's metrics, evaluation's counts, each agreement of
  a checkpoint save). Collectives are also counted: every rank enters the
  same ones in the same order, so two ranks with the same count are at the
  same collective, and a rank with a lower count has not reached it.

A mark only sets a few attributes: nanoseconds, watched or not. The rank's
watchdog thread (ddp_lab.guards.watchdog) publishes the place and acts on
it; ddp_lab.guards.stall turns places into the lines users read.
"""
from __future__ import annotations

import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path


class Place:
    """Where this process's training thread is. One per process (`HERE`)."""

    def __init__(self):
        self.step = 0
        self.phase = "starting"  # the stretch of work, or the collective, marked last
        self.inside = False  # waiting in that collective right now
        self.collective = False  # whether `phase` names a collective
        self.seq = 0  # collectives entered so far
        self.entered = time.monotonic()  # the last mark: progress
        self.since = time.time()  # the same, as wall time (other ranks read it)
        self.own_timeout_s = 0.0  # the collective's own timeout (torchft's, across islands): the watchdog waits longer

    def mark(self, phase: str, inside: bool = False, collective: bool = False, own_timeout_s: float = 0.0) -> None:
        self.phase, self.inside, self.collective, self.own_timeout_s = phase, inside, collective, own_timeout_s
        self.entered, self.since = time.monotonic(), time.time()

    def as_dict(self) -> dict:
        return {"step": self.step, "phase": self.phase, "inside": self.inside,
                "collective": self.collective, "seq": self.seq, "time": self.since,
                "process": process_identity()}


def process_state(pid: int) -> tuple[str, str]:
    """(state, start) of process `pid` from /proc: "T" for stopped; the start in clock
    ticks since boot (a pid is reused, the pair is not). ("?", "?") if unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], fields[19]
    except (OSError, IndexError):
        return "?", "?"


def process_identity() -> str:
    """host/pid/start of this process: another rank on the same host can find it, and a
    reused pid does not match (its start differs)."""
    pid = os.getpid()
    if _IDENTITY[0] != pid:
        _IDENTITY[:] = [pid, f"{socket.gethostname()}/{pid}/{process_state(pid)[1]}"]
    return _IDENTITY[1]


_IDENTITY: list = [None, ""]


HERE = Place()


def at_step(step: int) -> None:
    """The training thread starts optimizer step `step` (1-based)."""
    HERE.step = step


LISTENERS: list = []  # called with each phase's name as the thread enters it (faults' phase=P)


def on_phase(listener) -> None:
    """Call `listener(name)` each time the training thread enters a phase (ddp_lab.guards.faults)."""
    LISTENERS.append(listener)


def phase(name: str) -> None:
    """The training thread starts a stretch of its own work called `name`."""
    HERE.mark(name)
    for listener in LISTENERS:
        listener(name)


def progress() -> None:
    """Still going, in the same phase (a long one: evaluation)."""
    HERE.entered, HERE.since = time.monotonic(), time.time()


@contextmanager
def collective(name: str, own_timeout_s: float = 0.0):
    """Mark the enclosed block as a wait for every rank (see the module docstring).
    If it raises, the rank stays marked as inside: that is where it stopped. own_timeout_s: the wait
    ends by a timeout of its own first (torchft's, across islands): the watchdog allows that much more."""
    HERE.seq += 1
    HERE.mark(name, inside=True, collective=True, own_timeout_s=own_timeout_s)
    yield
    HERE.inside = False
    progress()
