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
it; the functions below turn places into the lines users read.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import re
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from ddp_lab.config import say
from ddp_lab.guards import error_file

log = logging.getLogger("ddp_lab")


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

    def mark(self, phase: str, inside: bool = False, collective: bool = False) -> None:
        self.phase, self.inside, self.collective = phase, inside, collective
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


def phase(name: str) -> None:
    """The training thread starts a stretch of its own work called `name`."""
    HERE.mark(name)


def progress() -> None:
    """Still going, in the same phase (a long one: evaluation)."""
    HERE.entered, HERE.since = time.monotonic(), time.time()


@contextmanager
def collective(name: str):
    """Mark the enclosed block as a wait for every rank (see the module docstring).
    If it raises, the rank stays marked as inside: that is where it stopped."""
    HERE.seq += 1
    HERE.mark(name, inside=True, collective=True)
    yield
    HERE.inside = False
    progress()


def _where(place: dict, now: float) -> str:
    where = ("waiting in" if place["inside"] else
             "after" if place.get("collective") else "in")
    return f"{where} {place['phase']} at step {place['step']}, {now - place['time']:.0f} s ago"


def describe(rank: int, place: dict | None, now: float) -> str:
    if place is None:
        return f"rank {rank} (never seen)"
    return f"rank {rank} ({_where(place, now)})"


def _same_collective(a: dict, b: dict) -> bool:
    return (a["phase"], a["step"]) == (b["phase"], b["step"])


def _out_of_step(me: dict, p: dict | None) -> bool:
    """A desync: `p` went past the collective `me` waits in, or sits in another one
    with the same count."""
    return p is not None and (p["seq"] > me["seq"] or (
        p["seq"] == me["seq"] and p["inside"] and not _same_collective(me, p)))


def missing(me: dict, places: dict[int, dict | None]) -> list[int]:
    """The ranks that have not reached the collective `me` is waiting in: never seen,
    fewer collectives entered (still computing, or stuck before it), or out of step."""
    return [r for r, p in places.items()
            if p is None or p["seq"] < me["seq"] or _out_of_step(me, p)]


def late_ranks(me: dict, places: dict[int, dict | None]) -> str:
    """The ranks not where `me` is, each with its place; a desync said as such."""
    late, now = missing(me, places), time.time()
    text = "; ".join(describe(r, places[r], now) for r in late) or "no rank (all arrived)"
    if any(_out_of_step(me, places[r]) for r in late):
        text += ": the ranks are out of step (a rank skipped or added a collective: a desync)"
    return text


def stall_report(rank: int, waited: float, places: dict[int, dict | None]) -> str:
    """`rank 0 has waited 61 s in gradient sync at step 120 for rank 1 (...)`."""
    me = places[rank]
    return (f"rank {rank} has waited {waited:.0f} s in {me['phase']} at step {me['step']} "
            f"for {late_ranks(me, places)}")


def no_progress_report(rank: int, waited: float, places: dict[int, dict | None]) -> str:
    """`rank 1 has made no progress for 301 s in data loading at step 7 (others: ...)`."""
    me, now = places[rank], time.time()
    others = "; ".join(describe(r, p, now) for r, p in places.items() if r != rank)
    return (f"rank {rank} has made no progress for {waited:.0f} s in {me['phase']} at step "
            f"{me['step']}" + (f" (the others: {others})" if others else ""))


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


CLOSED = re.compile(r"connection (closed|reset) by peer", re.IGNORECASE)  # gloo's words
_SOURCE = re.compile(r"^\[[^\]]+:\d+\]\s*")  # gloo's "[.../pair.cc:561] "


def short_cause(e: BaseException, limit: int = 120) -> str:
    """`Type: first line` of an exception for the one line, without gloo's source location
    and, past `limit` characters, only its first sentence (gloo adds advice and a 🏖️)."""
    lines = str(e).strip().splitlines()
    text = _SOURCE.sub("", lines[0]) if lines else ""
    if len(text) > limit:
        text = text.split(". ", 1)[0]
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def ended_here(place: dict) -> bool:
    """Whether the process that published `place` is known to have ended: it ran on this
    host and /proc has no such process (or a zombie its agent has not reaped yet, or a
    reused pid with another start)."""
    host, pid, start = (place.get("process", "").split("/") + ["", "", ""])[:3]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    state, now_start = process_state(int(pid))
    return now_start != start or state in ("Z", "X")


def lost_ranks(rank: int, places: dict[int, dict | None], cause: str) -> dict[int, str]:
    """The ranks known to be gone, each said with where it was last seen. On this host a
    rank whose process ended; on another host nothing shows an end, so only after a
    closed connection (`cause`) and only if one rank is not where this one is, its
    connection is said to have closed: no more is known."""
    now, others = time.time(), {r: p for r, p in places.items() if r != rank and p}
    lost = {r: f"rank {r} is gone (its process ended; last seen {_where(p, now)})"
            for r, p in others.items() if ended_here(p)}
    if lost or not CLOSED.search(cause):
        return lost
    here = socket.gethostname()
    away = [r for r in missing(places[rank], places)
            if r in others and _host(others[r]) not in (here, "")]
    if len(away) != 1:
        return {}
    r, p = away[0], others[away[0]]
    return {r: f"rank {r}'s connection closed (on {_host(p)}; last seen {_where(p, now)})"}


def _host(place: dict) -> str:
    return place.get("process", "").split("/")[0]


def why_stopped(rank: int, cause: str, watchdog=None, name_lost: bool = True) -> str:
    """One line: where this rank stopped and why. After a failed collective: first the
    ranks known gone (lost_ranks; not with `name_lost` False, when `cause` already
    quotes the rank that stopped first), then the ranks that were not where it was."""
    where = ("while starting" if HERE.phase == "starting" else
             f"{'after' if HERE.collective and not HERE.inside else 'in'} {HERE.phase}")
    places, lost = None, {}
    if watchdog is not None and HERE.inside:
        try:
            places = watchdog.places()
            lost = lost_ranks(rank, places, cause) if name_lost else {}
        except Exception:  # the store may be gone with the peer
            places = None
    if lost:
        cause = "; ".join(lost.values()) + f"; this rank got {cause}"
    line = f"rank {rank} stopped at step {HERE.step} {where}: {cause}"
    if places is not None:
        rest = {r: p for r, p in places.items() if r not in lost}
        if missing(places[rank], rest):
            line += "; not there: " + late_ranks(places[rank], rest)
    return line


def log_fatal_signals() -> None:
    """A rank killed by a fatal signal (gloo aborting on a collective of the wrong size,
    a segfault) writes "Fatal Python error: Aborted" and its stacks into its own log."""
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler) and h.stream is not None:
            faulthandler.enable(file=h.stream, all_threads=True)
            return


def end_process(line: str, code: int) -> None:
    """The last word of a rank that must stop now, from any thread: `line` on stderr and
    in its log (flushed), then exit with `code` without unwinding the training thread."""
    log.error("%s", line)
    say(line)
    error_file.write(line)  # torchrun's root cause (ddp_lab.guards.error_file)
    for h in logging.getLogger().handlers:
        h.flush()
    os._exit(code)


def report_stop(rank: int, cause: str, watchdog=None, name_lost: bool = True) -> str:
    """why_stopped() on stderr, in this rank's log and as torchrun's root cause, before
    torchrun's own report; the line, without "ddp_lab: "."""
    line = why_stopped(rank, cause, watchdog, name_lost)
    log.error("%s", line)
    say(f"ddp_lab: {line}")
    error_file.write(f"ddp_lab: {line}")
    return line


def log_to_file(text: str, exc_info=None) -> None:
    """`text` (and a traceback) into this rank's log file only: the console has the one
    line, and Hydra prints the traceback there."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, text, None, exc_info)
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            h.handle(record)
