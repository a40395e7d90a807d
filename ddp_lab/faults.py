"""Fault injection: make one rank fail on purpose, to watch how a job fails and recovers.

    DDP_LAB_FAULT="rank=1,step=5,kind=kill" torchrun ... -m ddp_lab.train

The fault fires on that rank right after optimizer step `step`, on a
launch's first attempt only (TORCHELASTIC_RESTART_COUNT=0), so that a
torchrun restart (--max-restarts) then runs clean. Kinds:

* raise: an exception, as a bug would.
* kill: SIGKILL, as the OOM killer would (no traceback, no cleanup).
* nan: from that step on, this rank's loss is NaN, as a diverging run's is.

The trainer asks `Fault.from_env()` once; without DDP_LAB_FAULT it gets
None and nothing here runs.
"""
from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

import torch

from ddp_lab.config import ConfigError

KINDS = ("raise", "kill", "nan")


@dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    kind: str

    @staticmethod
    def from_env() -> Fault | None:
        spec = os.environ.get("DDP_LAB_FAULT")
        if not spec or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
            return None
        usage = f"expected rank=R,step=N,kind={'|'.join(KINDS)}"
        try:
            parts = dict(part.split("=", 1) for part in spec.split(","))
            fault = Fault(int(parts["rank"]), int(parts["step"]), parts["kind"])
        except (KeyError, ValueError):
            raise ConfigError(f"DDP_LAB_FAULT={spec!r}: {usage}") from None
        if fault.kind not in KINDS:
            raise ConfigError(f"DDP_LAB_FAULT={spec!r}: kind must be one of {', '.join(KINDS)}")
        return fault

    def after_step(self, rank: int, step: int) -> None:
        """Fire, if this is the rank and the step (raise and kill)."""
        if rank != self.rank or step != self.step:
            return
        if self.kind == "kill":
            # A SIGKILLed rank leaves no traceback, and torchrun may name another rank's
            # failure first (the rank that hit the dead peer): say what happened here.
            print(f"DDP_LAB_FAULT: rank {rank} sends itself SIGKILL after step {step}",
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "raise":
            raise RuntimeError(f"DDP_LAB_FAULT: rank {rank} fails after step {step}")

    def loss(self, loss: torch.Tensor, rank: int, step: int) -> torch.Tensor:
        """The loss of step `step` (1-based: the step being taken), NaN once kind=nan fires."""
        if self.kind == "nan" and rank == self.rank and step >= self.step:
            return loss * float("nan")
        return loss
