"""A save on the way out: SIGTERM or SIGINT ends a run with a checkpoint, not a loss.

SLURM (at the time limit, on preemption, on scancel), Kubernetes (evicting a
pod) and torchrun (on Ctrl-C, or to stop the survivors when a rank failed)
send SIGTERM, or SIGINT, then SIGKILL about 30 s later. Stopping at once
would lose every step since the last checkpoint, so the handler only notes
the signal, and:

* the training thread finishes the step it is in, S; at that boundary it
  proposes to stop after P = S + 1, in this attempt's store. `compare_set`
  keeps the first proposal, so every rank reads one P. Ranks move in
  lockstep (each step's gradient sync waits for all): when one finishes S,
  none has finished S + 1, so every rank can still stop at P;
* a rank that got no signal (Kubernetes evicted another node's pod) learns P
  from a thread that reads the store every POLL_S, and says so in the store.
  The proposer starts step P only when every rank has (ACK_S at most), so no
  rank can finish P unaware; a rank that never answers is dead or stuck, and
  the proposer stops at once, without a save;
* at step P every rank writes a checkpoint and exits 128 + the signal (143);
* a deadline, `trainer.preempt_save_s` after the signal, ends the process if
  that takes longer (a dead peer, a stuck disk). A checkpoint is published by
  one atomic rename (ddp_lab.checkpoint.files), so a save cut short leaves no
  checkpoint behind and the previous one intact.

A rank that learned P from another rank before its own signal came (the
signals of a multi-node job reach the nodes apart) still saves at P: only a
second signal to the same rank counts as one.

A second signal, or `trainer.preempt_save_s=0`, stops at once without a save:
this rank's Python stacks go to <run dir>/stacks/rank<N>.txt and one line
says where it stopped. The same signal again within REPEAT_S is not a second
one: SLURM signals every process of a job (scancel, its time limit), so a
rank gets SIGTERM from SLURM and, a moment later, from its torchrun agent.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

from ddp_lab.distributed.rendezvous import BoundedStore
from ddp_lab.guards import stall
from ddp_lab.guards.watchdog import FAILED, join_quietly
from ddp_lab.telemetry import position

log = logging.getLogger("ddp_lab")

KEY = "preempt/stop_after"  # "<step> <rank> <signal>": the step every rank stops after
ACK = "preempt/read"  # /<rank>: that rank knows the step
POLL_S = 0.5  # how often a rank with no signal looks for a proposal
ACK_S = 5.0  # how long the proposer waits for every rank to read it
REPEAT_S = 2.0  # the same signal within this is the same request (see the docstring)
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Terminated(SystemExit):
    """Ends the process with 128 + the signal's number (143 for SIGTERM), through the
    entry point's `finally`: logs closed, process group torn down."""


class Preemption:
    """One per process: the signal handlers, the agreement on P, the deadline."""

    def __init__(self, rank: int, budget_s: float, run_dir: Path | None = None):
        self.rank, self.budget_s, self.run_dir = rank, budget_s, run_dir
        self.signal: str | None = None  # the signal this rank got, by name
        self.exit_code = 128 + signal.SIGTERM
        self.stop_after: int | None = None  # P, once proposed or learned
        self.proposer = ""  # "SIGTERM to rank 1": who asked, for the lines we print
        self.store, self.world_size = None, 1
        self._lock = threading.Lock()
        self.got_at = 0.0  # monotonic time of the signal (or of learning P)
        self.signalled_at = 0.0  # of this rank's own signal
        self._closed = threading.Event()
        self._poller: threading.Thread | None = None
        self._deadline: threading.Timer | None = None

    # ---------------------------------------------------------- set-up
    def install(self) -> Preemption:
        for sig in SIGNALS:
            signal.signal(sig, self._on_signal)
        return self

    def watch(self, store, world_size: int) -> None:
        """Look for another rank's proposal in this attempt's store (distributed runs)."""
        if not isinstance(store, BoundedStore):  # a cut-off host must not block the poll
            store = BoundedStore(store)
        self.store, self.world_size = store, world_size
        self._poller = threading.Thread(target=self._poll, name="ddp_lab_preempt", daemon=True)
        self._poller.start()

    def close(self) -> None:
        self._closed.set()
        join_quietly(self._poller)  # no store call in flight when the process exits

    @property
    def requested(self) -> bool:
        return self.signal is not None or self.stop_after is not None

    # ---------------------------------------------------------- the signal
    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if name == self.signal and time.monotonic() - self.signalled_at < REPEAT_S:
            log.info("rank %d: %s again (from SLURM and torchrun both): the same request",
                     self.rank, name)
            return
        if self._closed.is_set():  # saved and on its way out: nothing left to do
            return
        # Only this rank's own earlier signal makes this one a second: a step learned from
        # another rank first is the common case on many nodes (signals reach them apart).
        if self.signal is not None or self.budget_s == 0:
            self._stop_now(signum, "a second time" if self.signal else "trainer.preempt_save_s=0")
        self.signal, self.exit_code, self.signalled_at = name, 128 + signum, time.monotonic()
        if self.stop_after is not None:  # learned first: that save stands, its deadline runs
            log.warning("rank %d got %s at step %d: saving the checkpoint after step %d the "
                        "ranks agreed on (%s; a second %s stops at once)", self.rank, name,
                        position.HERE.step, self.stop_after, self.proposer, name)
            self._start_deadline()  # (started already, unless the signal came mid-_learn)
            return
        self.got_at = self.signalled_at
        line = (f"rank {self.rank} got {name} at step {position.HERE.step}: finishing the step and "
                f"saving a checkpoint within trainer.preempt_save_s={self.budget_s:g} "
                f"(a second {name} stops at once)")
        log.warning("%s", line)  # rank 0's log goes to the console too
        self._start_deadline()

    def _stop_now(self, signum: int, why: str) -> None:
        signal.signal(signum, signal.SIG_DFL)  # a third one kills outright
        name = signal.Signals(signum).name
        stacks = stall.dump_stacks(self.run_dir, self.rank) if self.run_dir else None
        stall.report_stop(self.rank, f"{name} ({why}: stopping at once, no save)"
                          + (f"; stacks in {stacks}" if stacks else ""), None)
        raise Terminated(128 + signum)

    def _start_deadline(self) -> None:
        if self._deadline is None:
            self._deadline = threading.Timer(self.budget_s, self._give_up)
            self._deadline.daemon = True
            self._deadline.start()

    def _give_up(self) -> None:
        if position.HERE.phase == "starting":  # torchrun's SIGTERM to the others when one rank fails to start
            self._no_save(f"{self.signal} came before its first step, and no step came within "
                          f"trainer.preempt_save_s={self.budget_s:g}: nothing new to save (if another rank "
                          f"failed first, its error says why)")
            return
        self._no_save(f"the save did not end within trainer.preempt_save_s={self.budget_s:g} "
                      f"of {self.proposer or self.signal}")

    def _no_save(self, why: str) -> None:
        """Out now, from a thread: the save cannot happen (a published checkpoint is
        whole or absent, so nothing partial is left)."""
        if self._closed.is_set():
            return
        stacks = stall.dump_stacks(self.run_dir, self.rank) if self.run_dir else None
        stall.end_process(f"ddp_lab: error: {stall.why_stopped(self.rank, why, None)}; exiting "
                          "without a checkpoint (the previous one is the resume point)"
                          + (f"; stacks in {stacks}" if stacks else ""), self.exit_code)

    # ---------------------------------------------------------- the agreement
    def stop_here(self, step: int) -> bool:
        """Called after every optimizer step: True at the step to save and stop at.
        Without a signal this is two attribute tests."""
        if not self.requested:
            return False
        if self.stop_after is None:
            self._propose(step)
        return step >= self.stop_after

    def _propose(self, step: int) -> None:
        if self.store is None:  # no other rank: stop right here
            self._learn(f"{step} {self.rank} {self.signal}")
            return
        mine = f"{step + 1} {self.rank} {self.signal}"  # the step every rank can still reach
        first = self.store.compare_set(KEY, "", mine).decode()
        self._learn(first)
        if first == mine:
            self._wait_for_everyone()

    def _wait_for_everyone(self) -> None:
        """Hold step P until every rank has read it: a rank that got no signal may be
        inside step P already, but cannot finish it while this rank waits here."""
        keys = [f"{ACK}/{r}" for r in range(self.world_size)]
        until = time.monotonic() + ACK_S
        while time.monotonic() < until and not self._has(FAILED):
            try:
                self.store.wait(keys, timedelta(seconds=0.1))
                return
            except Exception:  # a timeout; or the store went with a dead rank 0
                pass
        silent = [str(r) for r, k in enumerate(keys) if not self._has(k)]
        who = f"rank{'s' if len(silent) > 1 else ''} {', '.join(silent) or '?'}"
        self._stop_now(signal.Signals[self.signal],
                       f"{who} did not answer within {ACK_S:g} s, dead or stuck")

    def _has(self, key: str) -> bool:
        try:
            return self.store.check([key])
        except Exception:  # a lost store reads as absent
            return False

    def _learn(self, value: str) -> None:
        with self._lock:  # the training thread and the poll may both get here
            if self.stop_after is not None:
                return
            step, rank, name = value.split()
            self.proposer, self.stop_after = f"{name} to rank {rank}", int(step)
            if self.store is not None:
                self.store.set(f"{ACK}/{self.rank}", step)
        if self.signal is None:  # a peer's signal: this rank's deadline starts now
            self.exit_code, self.got_at = 128 + signal.Signals[name], time.monotonic()
            log.warning("rank %d: %s; saving a checkpoint after step %s", self.rank,
                        self.proposer, step)
            self._start_deadline()

    def _poll(self) -> None:
        while not self._closed.wait(POLL_S):
            try:
                if self.stop_after is None and self.store.check([KEY]):
                    self._learn(self.store.get(KEY).decode())
                if self.requested and self.store.check([FAILED]):
                    self._no_save(f"another rank gave up ({self.store.get(FAILED).decode()})")
            except Exception as e:  # a lost store must not kill training
                log.debug("preemption poll: %s", e)

    def report_save(self, path: Path | None) -> None:
        """Say what was saved at P and when, and stop polling: the rank exits (exit_code) next."""
        took = time.monotonic() - self.got_at
        what = (f"saved checkpoint {path.name}" if path is not None
                else "saved nothing (trainer.keep_ckpts=0)")
        log.warning("rank %d: %s %.1f s after %s; exit %d: continue with trainer.resume=auto",
                    self.rank, what, took, self.proposer, self.exit_code)
        self.close()
