"""A rank's watchdog: a thread that watches its training thread from start-up to exit.

Every PUBLISH_S it reads the place the training thread marked
(ddp_lab.guards.stall) and:

* publishes it to this attempt's store (ddp_lab.distributed.rendezvous) when it changed:
  one small write, off the training thread and never once a step, so the
  other ranks can say where this one is, even after it stopped answering;
* checks that the torchrun agent that started this rank is still its parent.
  An agent gone (SIGKILL, the OOM killer) leaves nobody to stop the job, and
  on a GPU node its workers would hold the GPUs for hours: the rank says so
  and exits at once, writing no result;
* when the training thread has waited in one collective longer than
  `dist.stall_warn_s`, logs which ranks have not arrived and where they were
  last seen; at `dist.timeout_s` it writes this rank's Python stacks to
  `<run dir>/stacks/rank<N>.txt`, prints one line naming them and ends the
  process (exit 1), so torchrun stops the job. (The process group's own
  timeout is set a little later, so that this line is what users read.) A
  wait that a timeout of its own ends first (torchft's, across islands) is
  given that much more;
* when the training thread has made no progress outside any collective for
  `dist.timeout_s` (a read from a dead network filesystem, a stuck disk, a
  deadlock), the same, naming this rank and its phase. The first step of a
  compiled model (phase "compile") is exempt: a cold compile can take
  minutes, and no other rank waits on it, since each compiles into its own
  cache (ddp_lab.training.fast_path); the ranks waiting for it still name it.

Why a thread in the rank and not torch.distributed.elastic.timer: elastic's
timers are enforced by the torchrun agent, which can kill a worker that no
longer answers, but only when the agent was started with its timer server
(TORCHELASTIC_ENABLE_FILE_TIMER=1), and a timer knows one worker's deadline,
not whom the other ranks wait for. This needs no setting and names the
missing rank and its phase; a rank that cannot answer at all (stopped, hung
in C) is named by the ranks waiting for it, which end the job.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path

from ddp_lab.distributed.rendezvous import BoundedStore, StoreUnreachable
from ddp_lab.guards import stall
from ddp_lab.telemetry import position

log = logging.getLogger("ddp_lab")

PUBLISH_S = 0.5  # how often the place is looked at (and published when it changed)
FAILED = "failed"  # store key: the first line of a rank that gave up (see note_failure)
NO_TIMEOUT = ("compile",)  # phases with no timeout of their own (see the docstring)


class Watchdog:
    """The watchdog thread of one rank. `store` None: a rank alone (nothing to publish)."""

    def __init__(self, store, rank: int, world_size: int, run_dir: Path, warn_s: float,
                 timeout_s: float):
        # every store call bounded: a host cut off from the network must not block this thread
        if store is not None and not isinstance(store, BoundedStore):
            store = BoundedStore(store)
        self.store, self.rank, self.world_size = store, rank, world_size
        self.run_dir, self.warn_s, self.timeout_s = Path(run_dir), warn_s, timeout_s
        # under torchrun our parent is the agent; a new parent means it is gone
        self.agent = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ddp_lab_watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        join_quietly(self._thread)

    def places(self) -> dict[int, dict | None]:
        """Every rank's last published place (None where nothing was published)."""
        found = {}
        for r in range(self.world_size):
            key = f"place/{r}"
            found[r] = (json.loads(self.store.get(key))
                        if self.store is not None and self.store.check([key]) else None)
        found[self.rank] = position.HERE.as_dict()  # our own, fresher than the store's copy
        return found

    def _watch(self) -> None:
        published, warned_for, tick = None, None, 0.0
        # at once, then every tick (with a store or without); once closed, not one more
        # look (a test's place may be gone)
        while not self._stop.wait(tick):
            tick = PUBLISH_S
            if self.agent is not None and os.getppid() != self.agent:
                self._end(f"rank {self.rank}: its torchrun agent (process {self.agent}) is gone "
                          "(killed, or out of memory) and nothing else would stop this rank; "
                          "stopping now, writing no result", stacks=False)
            here = position.HERE
            try:
                place = (here.step, here.phase, here.inside, here.seq)
                if self.store is not None:
                    self._check_reachable()
                if self.store is not None and place != published:
                    self.store.set(f"place/{self.rank}", json.dumps(here.as_dict()))
                    published = place
                waited = time.monotonic() - here.entered
                if here.inside:
                    if waited >= self.timeout_s + here.own_timeout_s:
                        self._give_up(stall.stall_report, waited)
                    if 0 < self.warn_s <= waited and warned_for != (place, here.entered):
                        warned_for = (place, here.entered)
                        log.warning("%s", stall.stall_report(self.rank, waited, self.places()))
                elif waited >= self.timeout_s and here.phase not in NO_TIMEOUT:
                    self._give_up(stall.no_progress_report, waited)
            except Exception as e:  # a lost store must not kill training
                log.debug("watchdog: %s", e)

    def _check_reachable(self) -> None:
        """End this rank once the store has not answered for dist.timeout_s: its host lost
        its peers (a cut cable, a dead switch) or the store's host is gone. A store call
        that nobody else made lately is made here, so silence is noticed in any phase."""
        if time.monotonic() - self.store.answered_at > 2 * PUBLISH_S and not self.store.unanswered_s():
            try:
                self.store.check([f"place/{self.rank}"])
            except StoreUnreachable:
                pass
        silent = self.store.unanswered_s()
        if silent >= self.timeout_s:
            self._end(f"rank {self.rank} lost its peers: the store at {self.store.where} has not "
                      f"answered for {silent:.0f} s (this host's network is down, or the store's "
                      f"host is gone), at step {position.HERE.step} in {position.HERE.phase}; giving "
                      f"up at dist.timeout_s={self.timeout_s:g}{self._end_agent()}")

    def _end_agent(self) -> str:
        """SIGKILL this rank's torchrun agent when its rendezvous does not answer either: the
        agent would wait on it as long, holding the node (measured on a cut-off emulated host:
        still waiting 11 minutes after its worker ended). One that can reach it is left to
        go on (elastic: its host rejoins). Says what it did."""
        endpoint = agent_endpoint(self.agent) if self.agent is not None else None
        if endpoint is None or answers(endpoint):
            return ""
        try:
            os.kill(self.agent, signal.SIGKILL)
        except OSError:
            return ""
        return (f"; its torchrun agent (process {self.agent}) cannot reach its rendezvous at "
                f"{endpoint[0]}:{endpoint[1]} either: ended it")

    def _give_up(self, report, waited: float) -> None:
        killed = ""
        try:
            places = self.places()
            line = report(self.rank, waited, places)
            if position.HERE.inside:
                killed = end_stopped(places, stall.missing(places[self.rank], places))
        except StoreUnreachable as e:  # this host lost its peers, or the store's host is gone
            line = (f"rank {self.rank} has waited {waited:.0f} s in {position.HERE.phase} at step "
                    f"{position.HERE.step} and lost its peers: {e}")
            killed = self._end_agent()
        except Exception as e:  # the store itself may be gone with rank 0
            line = (f"rank {self.rank} has waited {waited:.0f} s in {position.HERE.phase} at step "
                    f"{position.HERE.step} (the other ranks' places are unreadable: {e})")
        self._end(f"{line}; giving up at dist.timeout_s={self.timeout_s:g}{killed}")

    def _end(self, line: str, stacks: bool = True) -> None:
        path = stall.dump_stacks(self.run_dir, self.rank) if stacks else None
        line += f"; stacks in {path.parent}" if path else ""
        note_failure(self.store, line)
        stall.end_process(f"ddp_lab: error: {line}", 1)


def agent_endpoint(pid: int) -> tuple[str, int] | None:
    """The rendezvous endpoint on torchrun's command line (process `pid`), if it names one."""
    try:
        args = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")
    except OSError:
        return None
    for i, arg in enumerate(args):
        for flag in ("--rdzv-endpoint", "--rdzv_endpoint"):
            value = arg[len(flag) + 1:] if arg.startswith(flag + "=") else (
                args[i + 1] if arg == flag and i + 1 < len(args) else None)
            if value:
                host, _, port = value.rpartition(":") if ":" in value else (value, "", "29400")
                return host, int(port) if port.isdigit() else 29400
    return None


def answers(endpoint: tuple[str, int], timeout_s: float = 5.0) -> bool:
    """Whether a TCP connection to `endpoint` opens within `timeout_s`."""
    try:
        socket.create_connection(endpoint, timeout=timeout_s).close()
        return True
    except OSError:
        return False


def join_quietly(thread: threading.Thread | None, timeout_s: float = 2.0) -> None:
    """Wait for a stopped daemon thread to leave its store call. One still inside a C++
    call when the interpreter exits is ended by pthread_exit, which aborts the process
    ("terminate called without an active exception") after a run that succeeded."""
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
        thread.join(timeout_s)


def note_failure(store, line: str) -> None:
    """Tell the other ranks this one is giving up (best effort): a rank told to stop by
    torchrun then knows no checkpoint can be agreed on, and exits at once
    (ddp_lab.guards.preemption) instead of at trainer.preempt_save_s."""
    if store is None:
        return
    try:
        store.set(FAILED, line)
    except Exception:  # the store may be gone already
        pass


def first_failure(store) -> str | None:
    """The line of a rank that gave up before this one failed, if any (best effort)."""
    try:
        return store.get(FAILED).decode() if store is not None and store.check([FAILED]) else None
    except Exception:  # the store may be gone with its host
        return None


def end_stopped(places: dict[int, dict | None], ranks: list[int]) -> str:
    """SIGKILL those of `ranks` that are stopped (SIGSTOP) on this host; says which.
    A stopped rank cannot end itself, and torchrun's SIGTERM would wait in it for 30 s
    before its SIGKILL: the job would outlive dist.timeout_s by that much."""
    host = socket.gethostname()
    ended = []
    for r in ranks:
        where = (places.get(r) or {}).get("process", "").split("/")
        if len(where) != 3 or where[0] != host or not where[1].isdigit():
            continue
        pid = int(where[1])
        if position.process_state(pid) == ("T", where[2]):  # stopped, and the same process
            try:
                os.kill(pid, signal.SIGKILL)
                ended.append(str(r))
            except OSError:
                continue
    if not ended:
        return ""
    return f"; rank {', '.join(ended)} was stopped (SIGSTOP) on this host: killed it"
