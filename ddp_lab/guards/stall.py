"""Why a rank stopped or stalls, in lines users read, from the places ranks publish.

Each rank's training thread marks where it is (ddp_lab.telemetry.position); its watchdog
(ddp_lab.guards.watchdog) shares those places. The functions here name the ranks that have not
reached a collective, the rank a killed peer was, and the one line a rank prints as it ends.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import re
import socket
import time
from pathlib import Path

from ddp_lab.config import error_file, say
from ddp_lab.telemetry import position

log = logging.getLogger("ddp_lab")


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
    state, now_start = position.process_state(int(pid))
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
    where = ("while starting" if position.HERE.phase == "starting" else
             f"{'after' if position.HERE.collective and not position.HERE.inside else 'in'} {position.HERE.phase}")
    places, lost = None, {}
    if watchdog is not None and position.HERE.inside:
        try:
            places = watchdog.places()
            lost = lost_ranks(rank, places, cause) if name_lost else {}
        except Exception:  # the store may be gone with the peer
            places = None
    if lost:
        cause = "; ".join(lost.values()) + f"; this rank got {cause}"
    line = f"rank {rank} stopped at step {position.HERE.step} {where}: {cause}"
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
    error_file.write(line)  # torchrun's root cause (ddp_lab.config.error_file)
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
