"""Fault injection: make one rank fail on purpose, to watch how a job fails and recovers.

    DDP_LAB_FAULT="rank=1,step=5,kind=kill" torchrun ... -m ddp_lab.train

The fault fires on that rank right after optimizer step `step`, on a
launch's first attempt only (TORCHELASTIC_RESTART_COUNT=0), so that a
torchrun restart (--max-restarts) then runs clean. Kinds:

* raise: an exception, as a bug would.
* kill: SIGKILL, as the OOM killer would (no traceback, no cleanup).
* hang: the rank stops for good, as on a stuck kernel or a dead NFS mount.
* slow=F: from that step on, its forward and backward take F times as long.
* pace=S: from that step on, its forward and backward take at least S seconds,
  as on a machine of known speed: a run that must outlast a deadline on any
  machine (a time limit's warning) lasts as long on a fast one as on a slow one.
* mismatch: it skips that step's gradient sync: a desync.
* nan: from that step on, this rank's loss is NaN, as a diverging run's is.
* term: SIGTERM to its torchrun agent (its parent), which passes it to every
  worker, as SLURM at a time limit or Kubernetes evicting a pod would.
* stop: SIGSTOP (after a second, for its watchdog to publish where it is),
  as a debugger or `kill -STOP` would: a rank that cannot answer at all.

`phase=P` moves raise, kill, hang, term and stop from "after step N" to the
moment the rank enters a phase whose name starts with P at step N or later
(the phases the training thread marks with ddp_lab.telemetry.position: compile,
data loading, evaluation, checkpoint, ...): `rank=1,step=1,kind=stop,phase=compile`.

(slow, pace, mismatch and nan act from step `step` itself; the others right after it.)

This module parses the fault and fires it. The builder asks once (`Fault.on_rank`):
on the chosen rank, a fault that changes the step itself is built into it, nan into
the training loss (`nan_loss`) and mismatch into the sync (`skipping_sync`), and a
FaultInjection step callback (training/callbacks.py), listed after the checkpoint,
observes the steps: `slow_down` at a step's start, `after_step` at its end (and
`entering`, through position.on_phase). Without DDP_LAB_FAULT nothing is wrapped,
there is no callback, and the training step never asks about faults.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ddp_lab.config import ConfigError, say

KINDS = ("raise", "kill", "hang", "slow=F", "pace=S", "mismatch", "nan", "term", "stop")
PHASED = ("raise", "kill", "hang", "term", "stop")  # the kinds that phase=P can place


@dataclass
class Fault:
    rank: int
    step: int
    kind: str
    phase: str | None = None  # fire on entering this phase rather than after the step
    slept_s: float = 0.0  # kind=slow or pace: the sleep added to the last step's compute

    @staticmethod
    def from_env() -> Fault | None:
        spec = os.environ.get("DDP_LAB_FAULT")
        if not spec or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
            return None
        usage = f"expected rank=R,step=N,kind={'|'.join(KINDS)}[,phase=P]"
        try:
            parts = dict(part.split("=", 1) for part in spec.split(","))
            fault = Fault(int(parts.pop("rank")), int(parts.pop("step")), parts.pop("kind"),
                          parts.pop("phase", None))
            if parts:
                raise KeyError(next(iter(parts)))
        except (KeyError, ValueError):
            raise ConfigError(f"DDP_LAB_FAULT={spec!r}: {usage}") from None
        if fault.phase is not None and fault.kind not in PHASED:
            raise ConfigError(f"DDP_LAB_FAULT={spec!r}: phase= goes with kind={'|'.join(PHASED)}")
        known = (fault.kind in KINDS or (fault.kind.startswith("slow=") and _number(fault.kind, 1))
                 or (fault.kind.startswith("pace=") and _number(fault.kind, 0)))
        if not known:
            raise ConfigError(f"DDP_LAB_FAULT={spec!r}: kind must be one of {', '.join(KINDS)} "
                              "(F: a number above 1; S: seconds above 0)")
        return fault

    @staticmethod
    def on_rank(rank: int) -> Fault | None:
        """The fault DDP_LAB_FAULT asks for on this rank, or None (no fault, or another rank's)."""
        fault = Fault.from_env()
        return fault if fault is not None and fault.rank == rank else None

    def _here(self, rank: int, step: int) -> bool:
        return rank == self.rank and step >= self.step

    def after_step(self, rank: int, step: int) -> None:
        """Fire, if this is the rank and the step and no phase was named."""
        if self.phase is None and rank == self.rank and step == self.step:
            self.fire(rank, f"after step {step}")

    def entering(self, rank: int, phase: str, step: int) -> None:
        """Fire (once) as the rank enters the named phase at step >= self.step."""
        if self.phase is not None and self._here(rank, step) and phase.startswith(self.phase):
            self.phase = None  # once
            self.fire(rank, f"in {phase} at step {step}")

    def fire(self, rank: int, when: str) -> None:
        """raise, kill, hang, term or stop, now; says so on stderr (`when`: where)."""
        if self.kind == "kill":
            # A SIGKILLed rank leaves no traceback, and torchrun may name another rank's
            # failure first (the rank that hit the dead peer): say what happened here.
            say(f"DDP_LAB_FAULT: rank {rank} sends itself SIGKILL {when}")
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "term":
            say(f"DDP_LAB_FAULT: rank {rank} sends its torchrun agent SIGTERM {when}")
            os.kill(os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else os.getpid(),
                    signal.SIGTERM)
        if self.kind == "raise":
            raise RuntimeError(f"DDP_LAB_FAULT: rank {rank} fails {when}")
        if self.kind == "hang":
            say(f"DDP_LAB_FAULT: rank {rank} hangs {when}")
            threading.Event().wait()  # forever; a signal (torchrun's SIGTERM) still ends it
        if self.kind == "stop":
            # a second first, so that its watchdog has published this place (it
            # publishes every 0.5 s: an outside SIGSTOP finds it up to that stale)
            time.sleep(1.0)
            say(f"DDP_LAB_FAULT: rank {rank} sends itself SIGSTOP {when}")
            os.kill(os.getpid(), signal.SIGSTOP)

    def slow_down(self, rank: int, step: int, last_compute_s: float) -> None:
        """kind=slow=F, at a step's start: sleep (F-1) times the last step's own compute
        (without the sleep added to it), so that this step computes F times as long;
        kind=pace=S: sleep what the last step's own compute fell short of S seconds."""
        if self.kind.startswith(("slow=", "pace=")) and self._here(rank, step):
            own = max(0.0, last_compute_s - self.slept_s)
            if self.kind.startswith("slow="):
                self.slept_s = (_number(self.kind, 1) - 1) * own
            else:
                self.slept_s = max(0.0, _number(self.kind, 0) - own)
            time.sleep(self.slept_s)

    def skipping(self, step: int) -> bool:
        """kind=mismatch: whether `step` is the one whose gradient sync the rank leaves out."""
        return self.kind == "mismatch" and step == self.step

    def skips_sync(self, rank: int, step: int) -> bool:
        """kind=mismatch: the chosen rank leaves out the gradient sync of that one step (says so)."""
        if rank == self.rank and self.skipping(step):
            say(f"DDP_LAB_FAULT: rank {rank} skips the gradient sync of step {step}")
            return True
        return False

    def loss(self, loss: torch.Tensor, rank: int, step: int) -> torch.Tensor:
        """The loss of step `step` (1-based: the step being taken), NaN once kind=nan fires."""
        if self.kind == "nan" and self._here(rank, step):
            return loss * float("nan")
        return loss

    def nan_loss(self, loss_fn: Callable, progress) -> Callable:
        """kind=nan: `loss_fn` of (outputs, targets) made NaN from the fault's step on (`progress.step`: the
        steps taken); any other kind: `loss_fn` itself."""
        if self.kind != "nan":
            return loss_fn

        def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.loss(loss_fn(out, y), self.rank, progress.step + 1)
        return loss

    def skipping_sync(self, sync, progress):
        """kind=mismatch: the sync with the fault's step's gradient sync left out (SkippedSync); any other
        kind: `sync` itself."""
        return SkippedSync(sync, self, progress) if self.kind == "mismatch" else sync


class SkippedSync:
    """A sync (ddp_lab.sync) whose gradient sync of one step, the fault's, this rank leaves out: its
    micro-batches' backward as no_sync(), no after_backward(). Everything else is the sync's own."""

    def __init__(self, sync, fault: Fault, progress):
        self._sync, self._fault, self._progress = sync, fault, progress

    def __getattr__(self, name: str):
        return getattr(self._sync, name)

    def during_backward(self, last: bool):
        return self._sync.during_backward(last=last and not self._fault.skipping(self._progress.step + 1))

    def after_backward(self) -> None:
        if not self._fault.skips_sync(self._fault.rank, self._progress.step + 1):  # (says so)
            self._sync.after_backward()


def _number(kind: str, above: float) -> float | None:
    """The number of kind=slow=F or pace=S, or None if it is not a number above `above`."""
    try:
        x = float(kind.split("=", 1)[1])
    except ValueError:
        return None
    return x if x > above else None
