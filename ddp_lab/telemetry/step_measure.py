"""What a step measures, behind one switch: trainer.measure=full|light|off.

The loop's Measure callback (training/callbacks.py) calls one observer at four points of every
optimizer step (`step_starts`, `batch_done`, `synced`, `step_done`), and the observer alone
decides what is measured there:

| level | train loss | train accuracy | throughput, MFU | stragglers | communication time |
|---|---|---|---|---|---|
| full (default) | yes | yes (an argmax over the logits) | yes | yes (a hook on every parameter) | yes |
| light | yes | no | yes | no | no |
| off | no | no | yes | no | no |

What is not measured is NaN in the epoch's figures and summary.json, never 0. The guards
are not measurement: the divergence check and the step's loss at log steps run at every
level. On a GPU no level reads the device on a step that is not a log step.

Once a launch, at every level, the model state this rank holds is counted
(telemetry/memory.py) where it is largest: after the second step's gradient sync, when
the gradients and the optimizer's state (made by its first step) both exist.
"""
from __future__ import annotations

import time

import torch

from ddp_lab.telemetry.memory import model_state_bytes

LEVELS = ("full", "light", "off")


class StepMeasure:
    """The loop's one observer of a step: the Meter (throughput, the epoch's sums), the
    StepTimer (stragglers; built at level full only), the sync's communication timing and
    the profiler."""

    def __init__(self, level: str, meter, sync, profiler, step_timer=None, model_and_optimizer=None):
        self.level, self.meter, self.sync, self.profiler = level, meter, sync, profiler
        self.model_and_optimizer = model_and_optimizer
        self.model_state: dict[str, int] | None = None  # counted at the second sync of this launch
        self._syncs = 0
        self.step_timer = step_timer if level == "full" else None
        meter.counted = {"full": {"loss", "correct"}, "light": {"loss"}, "off": set()}[level]
        self._start = self._synced = 0.0  # this step's, where no StepTimer times it
        self.images = 0  # this rank's, in the current step

    def step_starts(self, images: int) -> None:
        self.images = images
        self.meter.start_step(images)
        self.sync.measuring = self.level == "full" and self.meter.measuring  # the same window
        if self.step_timer is not None:
            self.step_timer.start_step()
        else:
            self._start = time.perf_counter()

    def batch_done(self, loss: torch.Tensor, out: torch.Tensor, y: torch.Tensor) -> None:
        """One micro-batch's forward and backward are done (its loss, output and targets)."""
        if self.level != "off":
            self.meter.add_batch(loss, out, y)

    def synced(self) -> None:
        """The step's gradient sync is done (before the optimizer step)."""
        if self.step_timer is not None:
            self.step_timer.synced()
        else:
            self._synced = time.perf_counter()
        self._syncs += 1
        if self._syncs == 2 and self.model_and_optimizer is not None:
            self.model_state = model_state_bytes(*self.model_and_optimizer, self.sync)

    def step_done(self) -> None:
        self.meter.step_done(self.images)
        self.profiler.step()

    @property
    def last_compute(self) -> float:
        """Seconds the last step computed before its sync (with no StepTimer: up to the sync's end)."""
        if self.step_timer is not None:
            return self.step_timer.last_compute
        return self._synced - self._start

    def log_step(self) -> dict[str, float]:
        """What a log step adds to TensorBoard: the stragglers' window (level full)."""
        return self.step_timer.report() if self.step_timer is not None else {}

    def straggler(self, threshold: float) -> dict | None:
        return self.step_timer.straggler(threshold) if self.step_timer is not None else None
