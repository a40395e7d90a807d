"""The stall inspector: when a rank waits too long in a collective, say who is missing.

A collective waits for its slowest rank, and a rank that hangs (a stuck
kernel, a dead NFS mount, a stopped process) or skips a collective (a
desync) leaves every other rank waiting with nothing to say but a timeout.
So every rank says where it is, and the waiting ones read it:

* The training thread marks its place: `at_step(n)` and `with
  collective("gradient sync"): ...` around every collective (the gradient
  sync, the loss check under fp16, the epoch's metrics, evaluation's counts,
  checkpoint agreements). That only sets a few attributes: it costs
  nanoseconds, whether or not anyone watches.
* A watcher thread on each rank publishes that place to this attempt's
  store (ddp_lab.rendezvous) every PUBLISH_S when it changed: one small
  store write, off the training thread and not once a step (a store round
  trip each step would compete with the training thread for the GIL and
  the CPU). A rank that dies at once is found where it was at most
  PUBLISH_S before.
* When the training thread has waited in one collective longer than
  `dist.stall_warn_s`, the watcher reads every rank's place and logs which
  ranks have not arrived, at which step and in which collective, and what
  they were last seen doing; at `dist.timeout_s` it writes this rank's
  Python stacks to `<run dir>/stacks/rank<N>.txt`, prints one line naming
  the missing ranks, and ends the process (exit 1), so torchrun stops the
  job. (The process group's own timeout is set a little later, so that this
  report, not gloo's "Timed out waiting ... for recv", is what users read.)
"""
from __future__ import annotations

import faulthandler
import json
import logging
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from ddp_lab.config import say

log = logging.getLogger("ddp_lab")

PUBLISH_S = 0.5  # how often a changed place is published


class Place:
    """Where this process's training thread is. One per process (`HERE`)."""

    def __init__(self):
        self.step = 0
        self.phase = "starting"  # the collective entered last (or being waited in)
        self.inside = False  # waiting in that collective right now
        self.entered = time.monotonic()

    def as_dict(self) -> dict:
        return {"step": self.step, "phase": self.phase, "inside": self.inside, "time": time.time()}


HERE = Place()


def at_step(step: int) -> None:
    """The training thread starts optimizer step `step` (1-based)."""
    HERE.step = step


@contextmanager
def collective(phase: str):
    """Mark the enclosed block as a wait for every rank (see the module docstring).
    If it raises, the rank stays marked as inside: that is where it stopped."""
    HERE.phase, HERE.inside, HERE.entered = phase, True, time.monotonic()
    yield
    HERE.inside = False


def describe(rank: int, place: dict | None, now: float) -> str:
    if place is None:
        return f"rank {rank} (never seen)"
    where = "waiting in" if place["inside"] else "last entered"
    return (f"rank {rank} ({where} {place['phase']} at step {place['step']}, "
            f"{now - place['time']:.0f} s ago)")


def missing(me: dict, places: dict[int, dict | None]) -> list[int]:
    """The ranks that have not reached the collective `me` is waiting in."""
    return [r for r, p in places.items()
            if p is None or (p["step"], p["phase"], p["inside"]) != (me["step"], me["phase"], True)]


def late_ranks(me: dict, places: dict[int, dict | None]) -> str:
    """The ranks not where `me` is, each with its place; a desync said as such."""
    late, now = missing(me, places), time.time()
    text = "; ".join(describe(r, places[r], now) for r in late) or "no rank (all arrived)"
    if any(places[r] and places[r]["step"] == me["step"] and places[r]["phase"] != me["phase"]
           for r in late):
        text += ": the ranks are out of step (a rank skipped or added a collective: a desync)"
    return text


def stall_report(rank: int, waited: float, places: dict[int, dict | None]) -> str:
    """`rank 0 has waited 61 s in gradient sync at step 120 for rank 1 (...)`."""
    me = places[rank]
    return (f"rank {rank} has waited {waited:.0f} s in {me['phase']} at step {me['step']} "
            f"for {late_ranks(me, places)}")


def dump_stacks(run_dir: Path, rank: int) -> Path | None:
    """Every thread's Python stack into <run dir>/stacks/rank<N>.txt (None if it cannot)."""
    path = Path(run_dir) / "stacks" / f"rank{rank}.txt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            faulthandler.dump_traceback(f, all_threads=True)
    except OSError:
        return None
    return path


class StallInspector:
    """The watcher thread of one rank (see the module docstring)."""

    def __init__(self, store, rank: int, world_size: int, run_dir: Path, warn_s: float,
                 timeout_s: float):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.run_dir, self.warn_s, self.timeout_s = Path(run_dir), warn_s, timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ddp_lab_stall", daemon=True)

    def start(self) -> StallInspector:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()

    def places(self) -> dict[int, dict | None]:
        """Every rank's last published place (None where nothing was published)."""
        keys = [f"place/{r}" for r in range(self.world_size)]
        found = {}
        for r, key in enumerate(keys):
            found[r] = json.loads(self.store.get(key)) if self.store.check([key]) else None
        found[self.rank] = HERE.as_dict()  # our own, fresher than the store's copy
        return found

    def _watch(self) -> None:
        published, warned_for = None, None
        while not self._stop.wait(PUBLISH_S):  # a tick, or close()
            try:
                place = (HERE.step, HERE.phase, HERE.inside)
                if place != published:
                    self.store.set(f"place/{self.rank}", json.dumps(HERE.as_dict()))
                    published = place
                waited = time.monotonic() - HERE.entered
                if not HERE.inside:
                    continue
                if waited >= self.timeout_s:
                    self._give_up(waited)
                if waited >= self.warn_s and warned_for != (HERE.step, HERE.phase, HERE.entered):
                    warned_for = (HERE.step, HERE.phase, HERE.entered)
                    log.warning("%s", stall_report(self.rank, waited, self.places()))
            except Exception as e:  # noqa: BLE001  (a lost store must not kill training)
                log.debug("stall inspector: %s", e)

    def _give_up(self, waited: float) -> None:
        try:
            report = stall_report(self.rank, waited, self.places())
        except Exception as e:  # noqa: BLE001  (the store itself may be gone with rank 0)
            report = (f"rank {self.rank} has waited {waited:.0f} s in {HERE.phase} at step "
                      f"{HERE.step} (the other ranks' places are unreadable: {e})")
        stacks = dump_stacks(self.run_dir, self.rank)
        line = (f"ddp_lab: error: {report}; giving up at dist.timeout_s={self.timeout_s:g}"
                + (f"; stacks in {stacks.parent}" if stacks else ""))
        log.error(line)
        say(line)
        for h in logging.getLogger().handlers:
            h.flush()
        os._exit(1)


def why_stopped(rank: int, cause: str, inspector: StallInspector | None) -> str:
    """One line: where this rank stopped, why, and (after a failed collective) which
    ranks were not where it was."""
    where = (f"{'in' if HERE.inside else 'after'} {HERE.phase}" if HERE.phase != "starting"
             else "while starting")
    line = f"rank {rank} stopped at step {HERE.step} {where}: {cause}"
    if inspector is not None and HERE.inside:
        try:
            places = inspector.places()
            if missing(places[rank], places):
                line += "; not there: " + late_ranks(places[rank], places)
        except Exception:  # noqa: BLE001  (the store may be gone with the peer)
            pass
    return line


def log_fatal_signals() -> None:
    """A rank killed by a fatal signal (gloo aborting on a collective of the wrong size,
    a segfault) writes "Fatal Python error: Aborted" and its stacks into its own log."""
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler) and h.stream is not None:
            faulthandler.enable(file=h.stream, all_threads=True)
            return


def report_stop(rank: int, cause: str, inspector: StallInspector | None) -> None:
    """why_stopped() on stderr and in this rank's log, before torchrun's own report."""
    line = why_stopped(rank, cause, inspector)
    log.error("%s", line)
    say(f"ddp_lab: {line}")
